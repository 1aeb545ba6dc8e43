"""Clients, apart from the server: the directing client and the load tests behind `retake loadtest`."""
