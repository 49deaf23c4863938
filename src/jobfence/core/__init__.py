"""The core: the job, its codec, the retry policy, the fence and named leases."""
