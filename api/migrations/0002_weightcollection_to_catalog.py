# WeightCollection now belongs to the catalog (catalog 0004, which takes over the same table).
# Only Django's state forgets it here: the table and its rows stay.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0001_initial'),
        ('catalog', '0004_weightcollection_from_api'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='WeightCollection')],
            database_operations=[],
        ),
    ]
