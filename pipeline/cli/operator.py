"""`pipeline operator`: the operator's alert channel from the command line
(pipeline/notify/operator.py): try it, or tell it something a supervisor saw."""

from __future__ import annotations

import secrets

import click

from pipeline.cli import common


@click.group("operator", cls=common.HelpGroup)
def operator_group() -> None:
    """The operator's alert channel (PIPELINE_OPERATOR_ALERT_URL)."""


@operator_group.command("test")
def operator_test() -> None:
    """Send a test alert to the channel and say whether it was taken."""
    _tell("test", "Test alert from the listings pipeline",
          "A test alert: the pipeline's operator alerts reach this channel.")


@operator_group.command("tell")
@click.argument("title")
@click.argument("text", required=False)
@click.option("--event", type=click.Choice(["message", "stack_restarted"]), default="message", show_default=True,
              help="The alert's event: stack_restarted is what `dev.py up` tells when it restarts a stack that died.")
def operator_tell(title: str, text: str | None, event: str) -> None:
    """Tell the operator TITLE (and TEXT): what a supervisor or a script saw."""
    _tell(event, title, text or title)


def _tell(event: str, title: str, text: str) -> None:
    from pipeline.core.settings import Settings
    from pipeline.notify import operator

    settings = Settings.from_env()
    alert = operator.OperatorAlert(key=f"{event}-{secrets.token_hex(8)}", event=event, title=title, text=text)
    operator.send(settings, alert)  # a DeliveryError is a PipelineError: one line, status 1
    click.echo(f"told the operator: {title}")
