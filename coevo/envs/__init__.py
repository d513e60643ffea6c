"""Web environments: BrowserGym adapters for MiniWoB++ (offline) and WebArena-Lite (user-deployed sites)."""
