"""The user-facing shell: the ``wafervox`` command line (and, later, the websocket server)."""
