"""Dashboard of training progress and spend, and alarms on failed runs and throttling.

Training metrics are custom metrics that the aggregator and the planner emit with Powertools
(EMF log lines, no PutMetricData permission needed); their names, namespace and dimensions come
from smlt.runtime.metrics, the one source the handlers use too. Each widget is a SEARCH over exactly those
dimensions (run_id, service): one line per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from smlt.runtime import metrics

PERIOD = Duration.minutes(1)


def _search(metric: str, stat: str, label: str) -> cw.MathExpression:
    return cw.MathExpression(
        expression=metrics.search(metric, stat, int(PERIOD.to_seconds())),
        using_metrics={},
        label=label,
        period=PERIOD,
    )


def _graph(title: str, left: Sequence[cw.IMetric], left_y_axis: cw.YAxisProps | None = None) -> cw.GraphWidget:
    """One dashboard graph, three to a row of the 24-unit grid."""
    return cw.GraphWidget(title=title, left=left, left_y_axis=left_y_axis, width=8, height=6)


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        state_machine: sfn.StateMachine,
        functions: Mapping[str, lambda_.IFunction],
        dead_letters: sqs.IQueue,
        alarm_topic_arn: str | None,
    ) -> None:
        super().__init__(scope, id)
        five_min = Duration.minutes(5)

        alarms: list[cw.Alarm] = []
        alarms.append(
            cw.Alarm(
                self,
                "ExecutionsFailed",
                alarm_description="A training run failed (see the state machine's execution history)",
                metric=state_machine.metric_failed(period=five_min, statistic="Sum"),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            )
        )
        for name, fn in functions.items():
            alarms.append(
                cw.Alarm(
                    self,
                    f"Throttles{name}",
                    alarm_description=f"Lambda throttled {name}: account concurrency is the limit "
                    "(the state machine retries, but rounds slow down)",
                    metric=fn.metric_throttles(period=five_min, statistic="Sum"),
                    threshold=1,
                    evaluation_periods=1,
                    comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                    treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                )
            )
        alarms.append(
            cw.Alarm(
                self,
                "TriggerDeadLetters",
                alarm_description="An upload event could not start a training run (see the trigger's DLQ)",
                metric=dead_letters.metric_approximate_number_of_messages_visible(period=five_min, statistic="Maximum"),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            )
        )
        if alarm_topic_arn:
            topic = sns.Topic.from_topic_arn(self, "AlarmTopic", alarm_topic_arn)
            for alarm in alarms:
                alarm.add_alarm_action(cw_actions.SnsAction(topic))
        self.alarms = alarms

        dashboard = cw.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{Stack.of(self).stack_name}-training",
            default_interval=Duration.hours(3),
        )
        dashboard.add_widgets(
            cw.TextWidget(
                markdown=f"# smlt training\nCustom metrics (namespace `{metrics.NAMESPACE}`) come from the planner "
                "and the aggregator; one line per run.",
                width=24,
                height=2,
            )
        )
        dashboard.add_widgets(
            _graph(title="Loss", left=[_search(metrics.LOSS, "Average", "Loss")]),
            _graph(
                title="Validation accuracy",
                left=[_search(metrics.VAL_ACCURACY, "Average", "ValAccuracy")],
                left_y_axis=cw.YAxisProps(min=0, max=1),
            ),
            _graph(title="Round time (s)", left=[_search(metrics.ROUND_SECONDS, "Average", "RoundSeconds")]),
        )
        dashboard.add_widgets(
            _graph(
                title="Spend vs budget (USD)",
                left=[
                    _search(metrics.SPEND_USD, "Maximum", "SpendUSD"),
                    _search(metrics.BUDGET_USD, "Maximum", "BudgetUSD"),
                ],
            ),
            _graph(title="Workers per round", left=[_search(metrics.WORKERS, "Maximum", "Workers")]),
            _graph(title="Worker memory (MB)", left=[_search(metrics.MEMORY_MB, "Maximum", "MemoryMB")]),
        )
        dashboard.add_widgets(
            _graph(
                title="Executions",
                left=[
                    state_machine.metric_started(period=five_min, statistic="Sum"),
                    state_machine.metric_succeeded(period=five_min, statistic="Sum"),
                    state_machine.metric_failed(period=five_min, statistic="Sum"),
                    state_machine.metric_timed_out(period=five_min, statistic="Sum"),
                ],
            ),
            _graph(
                title="Lambda throttles",
                left=[
                    fn.metric_throttles(period=five_min, statistic="Sum", label=name) for name, fn in functions.items()
                ],
            ),
            _graph(
                title="Lambda errors",
                left=[fn.metric_errors(period=five_min, statistic="Sum", label=name) for name, fn in functions.items()],
            ),
        )
        dashboard.add_widgets(
            cw.AlarmStatusWidget(title="Alarms", alarms=alarms, width=24, height=3),
        )
        self.dashboard = dashboard
