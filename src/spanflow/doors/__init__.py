"""The site's doors for devices: the MQTT gateway (a PUBACK once JetStream stored the
reading) and HTTP ingest (a 200 once stored). Each publishes into the site's NATS as
the ``device`` role; neither is part of the coordinator's REST API (``server/``)."""
