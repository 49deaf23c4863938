"""No Django models: jobfence's tables are its own (``manage.py migrate`` creates them through
jobfence's migrations, see :mod:`.apps`). This module exists because Django only sends
``post_migrate`` to apps that have one."""
