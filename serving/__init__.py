"""Pure logic of the serve app: OpenAI request parsing and validation, the adapter registry."""
