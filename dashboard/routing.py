"""Websocket routes of the console; the live consumers arrive with the console issue."""

websocket_urlpatterns: list = []
