"""The agent endpoints Django serves; ``heartbeat`` is answered before Django, by fast.py."""

from django.urls import path

from agentapi import views

urlpatterns = [
    path("register", views.register, name="agent-register"),
    path("report", views.report, name="agent-report"),
    path("scan", views.scan, name="agent-scan"),
]
