"""Rule files: the rules of a rule-set version, in YAML (or JSON), checked like a
pipeline file — problems are reported as ``file:line: field: message``.

.. code-block:: yaml

    rules:
      - name: overheat
        pattern:
          within: 30s
          stages:
            - {stage: hot, where: "temperature > 80"}
            - {stage: drop, where: "pressure < 2"}
        select: {peak: "max(hot.temperature)"}
        timeouts: true
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spanflow.api.yaml_source import compose_located, located_problems
from spanflow.errors import PipelineFileError
from spanflow.spec.patterns import RuleSpec


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: tuple[RuleSpec, ...] = Field(min_length=1)


def load_rules_text(text: str, path: str = "<string>") -> tuple[RuleSpec, ...]:
    data, lines = compose_located(text, path)
    if not isinstance(data, dict):
        raise PipelineFileError(path, [(1, "", "a rule file is a mapping with 'rules:'")])
    try:
        return RuleFile.model_validate(data).rules
    except ValidationError as exc:
        raise PipelineFileError(path, located_problems(exc, lines)) from None


def load_rules(path: str | Path) -> tuple[RuleSpec, ...]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PipelineFileError(str(p), [(None, "", f"cannot read: {exc.strerror}")]) from None
    return load_rules_text(text, str(p))
