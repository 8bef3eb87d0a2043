"""Stage: publish. Talks to GitHub: REST client, sticky comments, runner plumbing, events.

Nothing here decides the verdict; every function that talks to GitHub either returns a result
that says what failed or raises ``GitHubError`` to a caller that turns it into a warning.

May import: the ground floor only.
"""
