"""Review: dead letters, their search and actions, replays, discards, job control and counts."""
