"""``tsi serve``: the HTTP gateway in front of the running service (``app.gateway``)."""
