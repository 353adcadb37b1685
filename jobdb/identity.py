"""What makes two scheduled jobs one: parameters in their stored (flat, dotted) form, and the
deliberate exception, a job added again on purpose."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from .nested import canonical_params, needs_canonical
from .sweep import JobSpec


def canonical_specs(specs: Sequence[JobSpec]) -> Sequence[JobSpec]:
    """Specs with nested parameters (dict values) flattened to dotted names: one job, however spelled.

    A sweep's own expansion (``params_json`` set) is flat already and passes untouched.
    """
    if not any(s.params_json is None and needs_canonical(s.params) for s in specs):
        return specs
    return [
        s._replace(params=canonical_params(s.params)) if s.params_json is None and needs_canonical(s.params) else s
        for s in specs
    ]


def duplicate_hashes(hashes: Sequence[str]) -> list[str]:
    """New identities for jobs added again on purpose (jobman's ``force_dup``, ``sqlschedule -f``):
    each hash salted with a fresh random token, so the copy is a row of its own."""
    return [hashlib.sha256(f"{h}\x1fcopy\x1f{os.urandom(16).hex()}".encode()).hexdigest() for h in hashes]
