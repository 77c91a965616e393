"""HTTP and WebSocket routes of the backend, one router per module."""
