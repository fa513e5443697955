"""Webhooks: where a subscription may point (`targets`) and the sending of its deliveries
(`sender`); the subscriptions and the outbox are `store/webhooks.py`."""
