"""Websocket routes of the console: one socket per page, under /ws/console/."""

from django.urls import path

from dashboard import consumers

websocket_urlpatterns = [
    path("ws/console/fleet/", consumers.FleetConsumer.as_asgi()),
    path("ws/console/nodes/<int:pk>/", consumers.NodeConsumer.as_asgi()),
    path("ws/console/nvlink/<int:pk>/", consumers.DomainConsumer.as_asgi()),
]
