"""A device for the namespaced-host tests: publishes COUNT readings at QoS 1 over
MQTT with TLS, one every INTERVAL seconds, each reading numbered, and prints how many
were acknowledged. Run inside the device's network namespace:

    python mqtt_device.py HOST PORT USER PASSWORD CA COUNT INTERVAL
"""

from __future__ import annotations

import sys
import time

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
    for i in range(int(count)):
        reading = {"id": i, "device": user, "temp": 20.0 + i % 7}
        infos.append(client.publish(f"plant/{user}/temp", orjson.dumps(reading), qos=1))
        time.sleep(float(interval))
    deadline = time.monotonic() + 60
    while not all(i.is_published() for i in infos) and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"acked {sum(i.is_published() for i in infos)}", flush=True)
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    main()
