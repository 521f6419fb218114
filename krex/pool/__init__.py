"""Code that runs in a warm pool worker, the fork server (worker), and the plan of a warm run
that it shares with `krex run` (plan). Above tenant: a worker arms auto-regions in what it
forks."""
