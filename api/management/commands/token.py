"""``llmgw token create --user NAME [--read-only] [--name TEXT]``: an API token for a person or a script.

1. Find the account; refuse, saying how to create one, when it does not exist.
2. Issue the token (stored hashed, as every token is); say so when the account holds no
   permission yet, since the token then opens no door (core.access).
3. Print the secret once, on stdout alone, so ``$(llmgw token create …)`` captures it;
   it cannot be shown again.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.models import ApiToken, AuditEntry


class Command(BaseCommand):
    help = "Create an API token for an operator account; the token is printed once."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a new token")
        create.add_argument("--user", required=True, help="the account the token acts for")
        create.add_argument("--read-only", action="store_true", help="may read (GET) but change nothing")
        create.add_argument("--name", default="", help="what the token is for, e.g. 'ctl on my laptop'")

    def handle(self, *args, action: str, user: str, read_only: bool, name: str, **options):
        account = get_user_model().objects.filter(username=user).first()
        if account is None:
            raise CommandError(f"no account named {user!r}; create it first with `llmgw createsuperuser`")
        if not account.is_active:
            raise CommandError(f"the account {user!r} is disabled; enable it in the admin first")
        label = name or ("read-only token" if read_only else "token") + " from the command line"
        token, secret = ApiToken.issue(account, label[:100], read_only=read_only)
        AuditEntry.record(user, "create-token", token.hint, {"read_only": read_only, "via": "command"})
        if not account.is_superuser and not (account.is_staff and account.get_all_permissions()):
            # Not refused: an administrator may mint first and give the group after. But said, since
            # the token opens no door until then (core.access), and a 403 later would puzzle.
            self.stderr.write(
                f"Note: {user!r} is not staff or holds no permission, so this token opens nothing yet; "
                "give the account a group (viewers, operators, finance) in the admin."
            )
        self.stderr.write(f"Token {token.hint} for {user}{' (read-only)' if read_only else ''}; shown once:")
        self.stdout.write(secret)
