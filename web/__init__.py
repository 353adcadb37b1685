"""``jobman serve``: a live web dashboard of a job database (the optional ``web`` extra)."""
