# Each replica gets its own engine key. Adding the field with its callable
# default would give every existing row the same one (Django computes a
# default once for an AddField), so the rows are filled one by one.

import secrets

from django.db import migrations, models

import placement.models


def fill_keys(apps, schema_editor):
    Replica = apps.get_model("placement", "Replica")
    for replica in Replica.objects.filter(engine_key="").only("pk").iterator():
        Replica.objects.filter(pk=replica.pk).update(engine_key=secrets.token_urlsafe(32))


class Migration(migrations.Migration):
    dependencies = [
        ("placement", "0003_shard_lifecycle_demand"),
    ]

    operations = [
        migrations.AddField(
            model_name="replica",
            name="engine_key",
            field=models.CharField(default="", editable=False, max_length=64),
        ),
        migrations.RunPython(fill_keys, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="replica",
            name="engine_key",
            field=models.CharField(default=placement.models.new_engine_key, editable=False, max_length=64),
        ),
    ]
