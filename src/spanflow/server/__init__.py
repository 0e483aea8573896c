"""The coordinator's REST API and dashboard endpoints; errors become HTTP here."""
