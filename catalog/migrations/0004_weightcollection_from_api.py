# WeightCollection moves here from the api app. Only Django's state changes: the table
# (api_weightcollection) was created by api 0001 and is kept as it is, with its rows.

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0001_initial'),
        ('catalog', '0003_catalog_file'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='WeightCollection',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('node', models.CharField(db_index=True, max_length=200)),
                        ('path', models.CharField(max_length=1000)),
                        ('name', models.CharField(blank=True, max_length=500)),
                        ('bytes', models.BigIntegerField(blank=True, help_text='NULL: the agent did not report the size.', null=True)),
                        ('requested_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ('requested_by', models.CharField(max_length=200)),
                        ('done_at', models.DateTimeField(blank=True, null=True)),
                        ('error', models.TextField(blank=True)),
                    ],
                    options={
                        'db_table': 'api_weightcollection',
                        'ordering': ['-requested_at', 'node', 'path'],
                        'constraints': [models.UniqueConstraint(condition=models.Q(('done_at__isnull', True)), fields=('node', 'path'), name='weightcollection_one_pending')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
