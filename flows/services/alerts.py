"""``prefect-rollouts alerts create``: the Prefect automation that sends a notification block a
message when an eval's comparison with its baseline emits ``prefect-rollouts.eval.regressed`` or
``...improved`` (``flows/services/baseline.py``)."""

from __future__ import annotations

from prefect.automations import AutomationCore
from prefect.client.orchestration import get_client
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import EventTrigger, Posture

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.baseline import IMPROVED, REGRESSED

ALERT_EVENTS = {"regressed": {REGRESSED}, "improved": {IMPROVED}, "both": {REGRESSED, IMPROVED}}


async def ensure_regression_automation(block: str, on: str = "regressed", name: str | None = None) -> tuple[str, bool]:
    """Create or update the automation that sends the notification block ``block`` (``<block type
    slug>/<block name>``, e.g. ``slack-webhook/evals``) a message for each ``on`` event
    (``regressed``, ``improved`` or ``both``) an eval emits.

    Returns:
        ``(name, created)``: the automation's name, and False when one of that name was updated.

    Raises:
        ConfigError: ``block`` is not ``slug/name`` or names no saved block; ``on`` is unknown.
    """
    from prefect.exceptions import ObjectNotFound

    if on not in ALERT_EVENTS:
        raise ConfigError(f"--on {on!r}: expected one of {', '.join(ALERT_EVENTS)}")
    slug, _, block_name = block.partition("/")
    if not slug or not block_name:
        raise ConfigError(f"--block {block!r}: expected <block type slug>/<block name>, e.g. slack-webhook/evals "
                          "(prefect block ls lists the saved blocks)")
    name = name or f"prefect-rollouts: eval alerts -> {block}"
    async with get_client() as client:
        try:
            document = await client.read_block_document_by_name(block_name, slug)
        except ObjectNotFound:
            raise ConfigError(f"--block {block!r}: no saved block of type {slug!r} named {block_name!r} on this "
                              "Prefect server (prefect block ls lists them)") from None
        capabilities = document.block_schema.capabilities if document.block_schema else []
        if "notify" not in capabilities:
            raise ConfigError(f"--block {block!r}: a {slug} block cannot send notifications. Name a notification "
                              "block (Slack Webhook, Custom Webhook, Email, Microsoft Teams, ...)")
        automation = AutomationCore(
            name=name,
            description=f"Sends {block} a message when an eval's comparison with its baseline shows a "
                        f"change ({on}; prefect-rollouts alerts create).",
            trigger=EventTrigger(expect=ALERT_EVENTS[on], match={"prefect.resource.id": "prefect-rollouts.*"},
                                 posture=Posture.Reactive, threshold=1),
            actions=[SendNotification(block_document_id=document.id, subject=NOTIFICATION_SUBJECT,
                                      body=NOTIFICATION_BODY)])
        existing = await client.read_automations_by_name(name)
        if existing:
            await client.update_automation(existing[0].id, automation)
            return name, False
        await client.create_automation(automation)
        return name, True


NOTIFICATION_SUBJECT = ("prefect-rollouts: {{ event.payload.environment }} "
                        "{{ event.event.split('.')[-1] }} in {{ event.payload.series }}")
NOTIFICATION_BODY = """\
{%- set p = event.payload -%}
{{ p.environment }} {{ event.event.split('.')[-1] }}: mean reward {{ '%.3f' | format(p.baseline_mean) }} -> \
{{ '%.3f' | format(p.mean) }}, difference {{ '%+.3f' | format(p.difference) }} \
({{ '%.0f' | format(p.confidence * 100) }}% interval \
[{{ '%+.3f' | format(p.ci_low) }}, {{ '%+.3f' | format(p.ci_high) }}]\
{%- if p.p_value is not none %}, p = {{ '%.2g' | format(p.p_value) }}{% endif %}, {{ p.n_paired }} rollouts paired).
Run {{ p.run_id }} against baseline {{ p.baseline_run_id }}.
{%- if p.n_flipped_to_fail %}
Pass -> fail ({{ p.n_flipped_to_fail }}): {{ p.flipped_to_fail | join(', ') }}\
{%- if p.n_flipped_to_fail > p.flipped_to_fail | length %}, ...{% endif %}
{%- endif %}
{%- if p.n_flipped_to_pass %}
Fail -> pass ({{ p.n_flipped_to_pass }}): {{ p.flipped_to_pass | join(', ') }}\
{%- if p.n_flipped_to_pass > p.flipped_to_pass | length %}, ...{% endif %}
{%- endif %}
{%- set url = flow_run | ui_url if flow_run else none %}
{%- if url %}
{{ url }}
{%- endif %}"""
