"""jobfence inside frameworks and ORMs: each integration is a door of its own, needs its extra
(``pip install 'jobfence[django]'``) and is imported by nothing else in the library."""
