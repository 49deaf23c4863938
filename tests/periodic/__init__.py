"""Periodic jobs: cron slots, the scheduler on both stores, several scheduler processes."""
