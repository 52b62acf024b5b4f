from django.urls import path

from agentapi import views

urlpatterns = [
    path("register", views.register, name="agent-register"),
    path("report", views.report, name="agent-report"),
    path("heartbeat", views.heartbeat, name="agent-heartbeat"),
    path("scan", views.scan, name="agent-scan"),
]
