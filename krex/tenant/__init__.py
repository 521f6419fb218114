"""Code that runs inside the user's command: region markers (`krex.region`), auto-regions and
the hooks they install (events, cuDNN, precompile, TunableOp), the sitecustomize that arms them
(_auto/), and the demo's command. Never imports the daemon, the client or the pool."""
