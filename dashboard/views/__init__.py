"""The console's pages: each has a context function, a page view and a fragment view over the same context.

The page renders the whole admin page; the fragment renders the part a live
update replaces, from the same function, so a patched page and a reloaded
one are always the same page.
"""
