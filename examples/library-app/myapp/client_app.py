"""The user's ClientApp: its own backbone and data, fedhead's client step for each message."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedhead.clients import SecureSite, evaluate_step, moment_reply, secure_mod, train_step
from fedhead.models import as_backbone
from fedhead.settings.config import load_procedure
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.train import LocalProblem, TrainConfig
from myapp.task import Net, load_partition


def secure_site(msg: Message, context: Context) -> SecureSite:
    """What this site's replies need when the run config says ``privacy-mode = "secure"``."""
    cfg = context.run_config
    lambdas = (float(cfg["lambda-h"]), float(cfg["lambda-w"]))
    return SecureSite(lambdas=lambdas, privacy=PrivacyPolicy(mode=str(cfg["privacy-mode"])))


# secure mode: the mod answers the secure sum's steps and sends each reply only as its share of a sum
app = ClientApp(mods=[secure_mod(secure_site)])


def setup(context: Context):
    """This node's partition, data, backbone (kept in ``context.state``), procedure and problem."""
    cfg = context.run_config
    pid = int(context.node_config["partition-id"])
    x, y = load_partition(pid, int(context.node_config["num-partitions"]), seed=int(cfg["seed"]))
    torch.manual_seed(int(cfg["seed"]))  # every client starts from the same backbone
    backbone = as_backbone(Net(), tuple(x.shape[1:]))
    if "backbone" in context.state.array_records:
        backbone.load_state_dict(context.state.array_records["backbone"].to_torch_state_dict())
    procedure = load_procedure(str(cfg["procedure"]))
    problem = LocalProblem.from_procedure(
        procedure, epochs=int(cfg["local-epochs"]), lambda_h=float(cfg["lambda-h"]), lambda_w=float(cfg["lambda-w"])
    )
    return pid, x, y, backbone, procedure, problem


@app.query()
def query(msg: Message, context: Context) -> Message:
    pid, _, y, _, _, _ = setup(context)
    return Message(moment_reply(y, pid), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    pid, x, y, backbone, procedure, problem = setup(context)
    recipe = TrainConfig(lr=float(context.run_config["lr"]), local_tol=float(context.run_config["local-tol"]))
    content = train_step(
        msg.content,
        backbone,
        x,
        y,
        procedure=procedure,
        problem=problem,
        train=recipe,
        partition_id=pid,
        seed=int(context.run_config["seed"]),
        device="cpu",
    )
    context.state["backbone"] = ArrayRecord(torch_state_dict=backbone.state_dict())
    # the user's own metric travels beside fedhead's and reaches the server's round records
    content.metric_records["metrics"]["backbone_norm"] = float(
        torch.sqrt(sum((p.detach() ** 2).sum() for p in backbone.parameters()))
    )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    pid, x, y, backbone, procedure, problem = setup(context)
    content = evaluate_step(
        msg.content, backbone, x, y, procedure=procedure, problem=problem, partition_id=pid, device="cpu"
    )
    return Message(content, reply_to=msg)
