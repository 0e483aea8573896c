"""A device for the namespaced-host tests: publishes COUNT readings at QoS 1 over
MQTT with TLS, one every INTERVAL seconds, each numbered and time-stamped, then one
reading an hour ahead (id -1) that closes every window, and prints how many of the
COUNT were acknowledged. Run inside the device's network namespace:

    python mqtt_device.py HOST PORT USER PASSWORD CA COUNT INTERVAL
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta

import orjson
import paho.mqtt.client as paho


def main() -> None:
    host, port, user, password, ca, count, interval = sys.argv[1:8]
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"{user}-device")
    client.username_pw_set(user, password)
    client.tls_set(ca_certs=ca)
    client.max_inflight_messages_set(100)
    client.reconnect_delay_set(min_delay=1, max_delay=2)
    client.connect(host, int(port), keepalive=10)
    client.loop_start()
    infos = []
    topic = f"plant/{user}/temp"
    for i in range(int(count)):
        now = datetime.now(UTC).isoformat()
        reading = {"id": i, "device": user, "ts": now, "temp": 20.0 + i % 7}
        infos.append(client.publish(topic, orjson.dumps(reading), qos=1))
        time.sleep(float(interval))
    # A last reading an hour ahead moves event time on, so every window closes.
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    closing = {"id": -1, "device": user, "ts": later, "temp": 0.0}
    infos.append(client.publish(topic, orjson.dumps(closing), qos=1))
    deadline = time.monotonic() + 60
    while not all(i.is_published() for i in infos) and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"acked {sum(i.is_published() for i in infos) - 1}", flush=True)
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    main()
