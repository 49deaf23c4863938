"""The shop's own data: orders, and the loyalty points a job credits for each."""

from django.db import models


class Order(models.Model):
    member_id = models.CharField(max_length=64)
    points = models.IntegerField()


class Credit(models.Model):
    """One row per job that credited points (a job that ran twice would leave two)."""

    job_id = models.CharField(max_length=255)
    member_id = models.CharField(max_length=64)
    points = models.IntegerField()
    note = models.CharField(max_length=64, default="")
