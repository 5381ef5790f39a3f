"""Typed configuration: the schema, and loading YAML plus dotted overrides into it."""
from settings.load import ConfigError, load_config, to_yaml
from settings.schema import Config

__all__ = ["Config", "ConfigError", "load_config", "to_yaml"]
