"""The console: live pages for the fleet, nodes, NVLink racks, fabrics and models."""

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self) -> None:
        # The console lives inside the admin (its login, its look, its links to
        # records), so its pages are added to the admin site's own URLs here,
        # before llmgw/urls.py reads admin.site.urls.
        from django.contrib import admin

        from dashboard import receivers
        from dashboard.site import install

        install(admin.site)
        # The lower apps tell of changes through signals they declare; the live pages hear them here.
        receivers.connect()
