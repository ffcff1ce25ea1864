"""One optimizer step of the device training tools (train_default_model.py, train_quality_model.py)."""
import torch


def train_step(model, opt, x, lr):
    """Next-token loss on the batch x (bf16 autocast), gradients clipped to norm 1, one step at learning rate lr.

    Returns the loss tensor.
    """
    for pg in opt.param_groups:
        pg["lr"] = lr
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, labels=x).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss
