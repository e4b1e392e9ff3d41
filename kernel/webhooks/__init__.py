"""Webhooks: approval requests, reminders and outcomes, pushed to where people are.

Configure them with ``KernelConfig(webhooks=[Webhook(name=..., url=..., secret=...)])``;
the kernel follows its journal and posts a notice for each escalation that needs a human
(``request``), reminders while it waits (``reminder``), and each vote, decision, expiry
and superseded approval (``outcome``), as generic signed JSON or a Slack-compatible
body. Deliveries are retried with backoff and recorded (WebhookDelivered,
WebhookFailed); they never block the kernel, and no secret is ever recorded.
"""

from kernel.webhooks._deliver import (
    DELIVERY,
    SIGNATURE,
    DeliveryFailed,
    Webhook,
    Webhooks,
    body_of,
    deliver,
    post,
    signature,
    verify,
)
from kernel.webhooks._notices import KINDS, Notice, generic_body, notice_of, reminder, slack_body

__all__ = [
    "DELIVERY",
    "KINDS",
    "SIGNATURE",
    "DeliveryFailed",
    "Notice",
    "Webhook",
    "Webhooks",
    "body_of",
    "deliver",
    "generic_body",
    "notice_of",
    "post",
    "reminder",
    "signature",
    "slack_body",
    "verify",
]
