"""Ollama's API: its requests as Podium's conversations, its answers rendered from the same
events as every other API's."""
