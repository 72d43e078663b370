"""The egress proxy: the one way out of a runtime under a ``{ allow, block }`` network policy.

``proxy.py`` is ``EgressProxy`` (one per open agent, a listener per runtime); ``wire.py`` reads what a
runtime sends (a proxy request head, a TLS ClientHello); ``address.py`` decides which resolved
addresses may be reached. Imports ``config``, ``errors`` and the trace's records, never a runtime. Must not
import Prefect.
"""
