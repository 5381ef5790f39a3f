"""Long-lived actors. Each is a plain class; placement applies ray.remote where it is placed."""
