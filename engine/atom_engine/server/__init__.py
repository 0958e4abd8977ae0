"""The engine's HTTP server: OpenAI routes, health, readiness and Prometheus metrics (aiohttp)."""
