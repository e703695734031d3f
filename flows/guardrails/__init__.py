"""Guardrails: metrics sent with feedback, compared between the bandit's selections and the
holdout by an anytime-valid test (``sequential``), acted upon by the gateway (``control``)."""
