"""``spanflow demo``: its pipelines (:mod:`.pipelines`), and the cluster demo — two
factories and a cloud on this machine (:mod:`.cluster`), what it shows live
(:mod:`.feed`, :mod:`.view`).

``spanflow run spanflow.demo:flow`` runs the single-node pipeline.
"""

from spanflow.demo.pipelines import SITES as SITES
from spanflow.demo.pipelines import TEMPERATURE_LIMIT as TEMPERATURE_LIMIT
from spanflow.demo.pipelines import VIBRATION_LIMIT as VIBRATION_LIMIT
from spanflow.demo.pipelines import device_windows as device_windows
from spanflow.demo.pipelines import factory_monitoring as factory_monitoring
from spanflow.demo.pipelines import flow as flow
from spanflow.demo.pipelines import overheat_then_vibration as overheat_then_vibration
from spanflow.demo.pipelines import reading_alerts as reading_alerts
from spanflow.demo.pipelines import sensor_alerts as sensor_alerts
from spanflow.demo.pipelines import validated as validated
