"""The one sanitiser of names made from config values: ``slug``.

It makes the parts of a run id's default prefix (``EvalConfig.run_prefix``: a harness id, a model
such as ``local/smollm2``) and, in ``flows/services/keys.py``, the artifact keys and Variable names an eval
keeps on the Prefect server. Must not import Prefect.
"""

from __future__ import annotations


def slug(name: str) -> str:
    """``name`` lowercased, every character but ASCII letters and digits replaced by ``-``
    (Prefect's artifact-key alphabet): ``local/smollm2`` is ``local-smollm2``, ``Qwen/Qwen2.5-7B``
    is ``qwen-qwen2-5-7b``. Not one-to-one (``a/b`` and ``a-b`` meet): ``flows.keys.prefect_key``
    adds a hash where that matters."""
    return "".join(c if c.isascii() and c.isalnum() else "-" for c in name.lower())
