"""Code that runs in `krex run` and the other client commands: the connection to the daemon and
the run itself (run), the watch that thaws what a dead daemon froze (watch), segment names
left by a stopped daemon (leftovers), and `krex demo` (demo). Never imports the daemon."""
