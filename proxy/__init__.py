"""ctxproxy: an OpenAI-compatible reverse proxy that manages an agent's context window."""

__version__ = "0.1.0"
