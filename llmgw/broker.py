"""The embedded broker: kombu's filesystem transport, with messages that appear whole.

kombu's own transport creates a message's file under its final name and
then writes into it, while the reader lists the folder, moves any file of
its queue away and reads it, without the writer's lock. A reader that
comes between the two reads an empty message, fails to decode it, and the
worker stops for good — seen here as the embedded worker dying under load.
Here a message is written under a name no reader picks up and then renamed
to its final name, which on one filesystem is atomic: a reader sees the
whole message or nothing.

``llmgw.celery`` points kombu's ``filesystem://`` at this transport, so the
broker URL, the health check and the folders stay as they were.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)
# Readers take only names ending ".<queue>.msg"; this prefix has no dot, so
# a file being written is never one of them.
WRITING = "writing-"


class Channel(filesystem.Channel):
    def _get(self, queue):
        """The next message of ``queue``; one that is not a message (torn, foreign) is dropped with an error.

        kombu raises on it, and a worker that meets that error stops for good:
        one bad file in the folder would end every periodic task.
        """
        try:
            return super()._get(queue)
        except ValueError as exc:
            log.error("embedded broker: dropped a file of queue %r that is not a message (%s)", queue, exc)
            raise Empty from None

    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` on ``queue``: written whole under a private name, then renamed into place."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f"{WRITING}{uuid.uuid4().hex}")
        try:
            with open(partial, "wb", buffering=0) as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
