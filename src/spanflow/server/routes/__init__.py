"""REST routes, one module per resource; each adds its routes to the app."""
