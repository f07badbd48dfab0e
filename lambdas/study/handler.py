"""Study controller Lambda: parse the event, call the controller step, return its small answer."""

from aws_lambda_powertools import Logger
from pydantic import BaseModel

from smlt.runtime import metrics
from smlt.runtime.steps.events import parse_event
from smlt.runtime.study import controller
from smlt.runtime.study.cause import trial_cause
from smlt.runtime.study.events import (
    STUDY_EVENTS,
    AdmitEvent,
    EndedEvent,
    FinishEvent,
    InitEvent,
    StudySettings,
    WatchEvent,
)

logger = Logger(service=metrics.SERVICE)


def handler(event, context):
    answer: BaseModel
    s = StudySettings()
    place = controller.Place(table=s.table, artifacts_bucket=s.artifacts_bucket)
    ev = parse_event(STUDY_EVENTS, event)
    match ev:
        case InitEvent():
            answer = controller.init(place, ev.study, ev.execution)
        case AdmitEvent():
            answer = controller.admit(place, ev.study_id, ev.trial)
        case EndedEvent():
            answer = controller.ended(place, ev.study_id, ev.trial, trial_cause(ev.error))
        case WatchEvent():
            answer = controller.watch(place, ev.study_id)
        case FinishEvent():
            answer = controller.finish(place, ev.study_id)
    result = answer.model_dump(mode="json", exclude_unset=True)
    logger.info("study", extra={"op": ev.op, "result": result})
    return result
