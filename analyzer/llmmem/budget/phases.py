"""One training step as a sequence of moments; the peak is the largest of them.

Moments of a step, each a sum of components (see `MEMORY-MODEL.md`):

- end of forward: weights, optimizer states (after the first step), gradients kept across
  accumulation, autocast weight copies, saved activations, the logits and the loss;
- start of backward: the same, with the log-softmax gradient spike instead of the forward logits;
- the head's backward: the logits' gradient and the head's weight gradient;
- the first block's recompute (gradient checkpointing): one block's full activations;
- end of backward: every gradient complete, activations freed;
- the optimizer step: weights, gradients, states and the step's own buffers.

Activations and gradients trade places during backward at a constant rate per block, so the
sum in between never exceeds the larger of its two ends.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import (
    backward_workspace,
    checkpoint_input_bytes,
    dtypes_for,
    estimate_activations,
)
from llmmem.budget.bands import band_class
from llmmem.budget.context_parallel import attention_in_flight, with_context_parallel
from llmmem.budget.distributed import (
    gathered_block_params,
    persistent_groups,
    prefetch_elements,
    sharding_for,
)
from llmmem.budget.expert_parallel import expert_parallel_spec
from llmmem.budget.float8 import float8_text
from llmmem.budget.float8_te import te_float8_text, te_head_gradient_bytes, te_refusal
from llmmem.budget.fsdp_moments import (
    fsdp1_retained_inputs,
    fsdp_block_moments,
    fsdp_last_moments,
    root_reduce_scatter,
)
from llmmem.budget.logits import logits_count, logits_hole, logits_moments
from llmmem.budget.model_states import (
    model_state_terms,
    step_temporaries,
    stepped_in_backward,
    zero_buffers,
)
from llmmem.budget.optimizers import find_optimizer
from llmmem.budget.overheads import (
    overhead_terms,
    reserved_and_device_total,
    unified_memory,
    with_load_kept,
)
from llmmem.budget.result import Budget, Component, GpuTarget, Overhead, Phase, PhaseBudget, Term
from llmmem.budget.setup import Method, Mode, SetupError, TrainingSetup
from llmmem.budget.stacks import own_inventory, own_model, stack_for
from llmmem.budget.step_terms import (
    cached_at_the_loss,
    compile_floor_text,
    first_block_gradients_to_come,
    forward_only_terms,
    fp32_head,
    fsdp_mixed_precision,
    offload_floor_text,
    offloaded_activations,
    plus_term,
    sixteen_bit,
    temporaries_text,
    weight_copy_terms,
)
from llmmem.budget.tensor_parallel import logits_shard, tensor_parallel_spec
from llmmem.budget.vision import (
    vision_activations,
    vision_phase_parts,
    with_image_tokens,
    with_pixel_values,
)
from llmmem.budget.weights import build_inventory
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes


def estimate_budget(
    spec: ModelSpec,
    setup: TrainingSetup,
    gpu: GpuTarget | None = None,
    *,
    with_first_step: bool = True,
    offloaded: bool | None = None,
) -> Budget:
    """The memory of one training step (or of generation) of `spec` under `setup`.

    `offloaded`: with activation offloading asked for, None gives the step with the saved
    activations on the device and a band reaching down to the step with all of them on the
    host (True); how much of them a real run keeps on the device is not predicted, unless the
    framework's stack says its offloading moves every tensor it may (torchtune's): then the
    offloaded step is the estimate.

    The setup's framework's stack (llmmem.budget.stacks) is asked where its code differs from
    the shared rules: what it refuses, what it always does, its blocks, its quantized layout,
    its buffers, its loss, its weight copies and its offloading."""
    setup, image_notes = with_image_tokens(spec, setup)
    if setup.distributed.cp_size > 1 and setup.mode is Mode.GENERATE:
        raise SetupError("context parallelism is sized for training steps, not generation")
    if setup.mode is Mode.GENERATE:
        from llmmem.budget.generation import estimate_generation

        return estimate_generation(spec, setup, gpu)
    stack = stack_for(setup.framework)
    stack.check(setup)
    setup = stack.prepare(setup)
    spec = own_model(stack, spec, setup)
    te_reason = te_refusal(spec, setup) if setup.float8_te else None
    if te_reason is not None:
        raise SetupError(f"TransformerEngine's FP8: {te_reason}")
    exact_offload = setup.activation_offload and stack.offload_is_exact
    if offloaded is None and ((setup.activation_offload and not exact_offload) or setup.compile):
        kept = estimate_budget(
            spec, setup, gpu, with_first_step=with_first_step, offloaded=exact_offload
        )
        floors: list[tuple[int, str]] = []
        if setup.activation_offload and not exact_offload:
            gone = estimate_budget(
                spec, setup, gpu, with_first_step=with_first_step, offloaded=True
            )
            floors.append((gone.device_total_bytes, offload_floor_text(gone.device_total_bytes)))
        if setup.compile:
            if setup.grad_ckpt:
                floors.append((kept.device_total_bytes, compile_floor_text(None)))
            else:
                # the compiled step under checkpointing: the blocks' inputs and the fused loss
                plain = replace(setup, grad_ckpt=True, activation_offload=False)
                least = estimate_budget(
                    spec, plain, gpu, with_first_step=with_first_step, offloaded=False
                ).device_total_bytes
                floors.append((min(least, kept.device_total_bytes), compile_floor_text(least)))
        floor = min(bytes_ for bytes_, _ in floors)
        whys = [why for _, why in floors]
        return replace(kept, band_floor=(floor, "; ".join(whys)), notes=[*kept.notes, *whys])
    offloaded = bool(offloaded) or exact_offload
    whole = setup  # each rank's share of the sequence under context parallelism, below
    setup, cp_notes = with_context_parallel(spec, setup)
    whole_model = spec  # one rank's share of each block under tensor parallelism, below
    if setup.distributed.tp_size > 1 and setup.quant is not None:
        raise SetupError("tensor parallelism of k-bit (bitsandbytes) weights is not sized")
    spec, tp_notes = tensor_parallel_spec(spec, setup.distributed.tp_size)
    spec, ep_notes = expert_parallel_spec(spec, setup)  # E / ep experts of each MoE layer
    cp_notes += tp_notes + ep_notes
    shard = sharding_for(setup)
    if shard.master_weights:
        # DeepSpeed casts the whole model, adapters too, to 16 bits and runs it without
        # autocast (the fp32 copy is its master weights, counted with the states)
        setup = sixteen_bit(setup)
    # how the model computes: FSDP under autocast gathers its parameters in 16 bits
    # (accelerate's mixed-precision policy), so forward and backward run as in pure 16 bits
    # while the sharded parameters, gradients and states stay fp32
    run = sixteen_bit(setup) if fsdp_mixed_precision(setup) else setup
    inv = build_inventory(
        spec,
        setup,
        quantized_bytes=stack.quantized_bytes(setup),
        buffers=stack.buffers(spec, setup),
    )
    inv = own_inventory(stack, spec, setup, inv)
    optim = find_optimizer(setup.optim)
    st = model_state_terms(spec, setup, inv, optim, shard)
    rules = stack.block_rules(spec, run)
    acts = estimate_activations(spec, run, rules)
    own_loss = stack.loss(spec, run)
    logits = own_loss.moments if own_loss is not None else logits_moments(spec, run)
    dt = dtypes_for(run)
    notes: list[str] = (
        list(inv.notes) + list(spec.notes) + stack.notes(spec, setup) + image_notes + cp_notes
    )
    if setup.optimizer_in_backward:
        st = stepped_in_backward(st, inv, optim)
        notes.append(
            "optimizer in backward: each parameter is stepped as its gradient is made and the "
            "gradient freed, so at most one gradient exists at a time"
        )

    if setup.grad_ckpt:
        saved, saved_text = checkpoint_input_bytes(spec, run)
        saved += acts.outside.evaluate(acts.dims)
        recompute = acts.largest_block_bytes
        acts_formula = f"{saved_text} (checkpointed block inputs) + final norm and head input"
    else:
        saved = acts.full_bytes
        recompute = 0
        formulas = "; ".join(f"{g.count} × ({t.formula()})" for g, t in acts.per_block)
        acts_formula = f"{formulas} + ({acts.outside.formula()})"
    own_offload = stack.offloaded(spec, run, acts) if offloaded else None
    if offloaded:
        saved, acts_formula = offloaded_activations(spec, run, acts)
        recompute = acts.largest_block_bytes
        if own_offload is not None:
            saved, acts_formula = own_offload.after_forward.bytes, own_offload.after_forward.formula
    vision = vision_activations(spec, run)
    if vision is not None and vision.saved.bytes:
        saved += vision.saved.bytes
        acts_formula += f" + {vision.saved.formula}"
    activations = Term(bytes=saved, formula=acts_formula)
    n_h = setup.tokens * spec.hidden_size
    workspace, workspace_text = backward_workspace(spec, run, rules)
    # offloaded, autocast's casts of frozen weights leave with the saved tensors, as the ones
    # outside the running block do under checkpointing (the head's stays: no-op hooks there)
    copies_setup = (
        replace(run, grad_ckpt=True) if offloaded and setup.method is not Method.FULL else run
    )
    copies_fwd, copies_bwd, copies_recompute = weight_copy_terms(spec, copies_setup, inv)
    own_copies = stack.weight_copies(spec, copies_setup)
    copies_block = 0  # inside any block's forward or backward
    if own_copies is not None:
        copies_fwd, copies_bwd = own_copies.at_loss, own_copies.backward_start
        copies_recompute, copies_block = own_copies.recompute, own_copies.in_block
    copies_text = (
        own_copies.formula
        if own_copies is not None
        else float8_text()
        if setup.float8
        else te_float8_text(spec, setup)
        if setup.float8_te
        else (
            "one dequantized k-bit weight (the largest Linear)"
            + (
                " + autocast's 16-bit cast of the fp32 head, kept for the input gradient"
                if dt.autocast and fp32_head(setup) and spec.is_causal_lm
                else ""
            )
            if setup.quant is not None
            else "bf16/fp16 copy of every Linear weight held by autocast"
            if setup.method is Method.FULL
            else "autocast's 16-bit cast of each frozen Linear weight, kept for the input gradient"
            + (" (one block: checkpointed) + the head's" if setup.grad_ckpt else " + the head's")
        )
    )
    gathered = 0  # at every moment of forward and backward
    block_gathered = 0  # FSDP: while a block runs, with the next one prefetched
    block_gradients = 0  # FSDP: a block's unsharded gradients in its backward
    root = 0  # FSDP: the root unit, gathered
    root_gradients = 0  # FSDP: the root unit's unsharded gradients at the end of backward
    root_head_gradient = 0  # FSDP: the head's unsharded gradient, from its backward on
    if shard.gathered_blocks:
        per_block = max((g.params_per_block for g in spec.blocks), default=0)
        if setup.distributed.zero_stage == 3 and shard.shard_group > 1:
            # ZeRO-3 releases a gathered parameter only when its next use is more than
            # stage3_max_reuse_distance elements of parameters away; forward's last modules
            # come back first in backward, so about half that distance stays gathered
            # (the whole model, below it) besides the module running (on one rank the
            # partition is the whole parameter: nothing to gather)
            # ZeRO-3 also gathers up to stage3_prefetch_bucket_size elements ahead of use;
            # parameters kept whole on every rank are in the weights
            reuse = setup.distributed.max_reuse_distance // 2
            ahead = prefetch_elements(setup, spec.hidden_size)
            persistent = persistent_groups(setup, spec.hidden_size, inv.groups)
            partitioned = spec.total_params - sum(g.params for g in persistent)
            # a frozen, untied embedding that backward never reaches (no checkpointing to make
            # its output require grad) is not used again in the step: released after forward
            untied = any(g.kind == "head" for g in inv.groups)
            if untied and not setup.grad_ckpt:
                partitioned -= sum(
                    g.params for g in inv.groups if g.kind == "embedding" and not g.trainable
                )
            gathered = min(partitioned, reuse + per_block + ahead) * dt.compute
        if setup.distributed.fsdp is not None:
            per_block = max((gathered_block_params(g, shard) for g in spec.blocks), default=0)
            # FSDP's root unit (embeddings, final norm, head: what no block holds) is gathered
            # when forward starts and stays whole until its gradients are reduced in backward.
            # A block's worth of gathered memory is alive at every moment measured, also at
            # the loss (FSDP2, simulated and on the CPU); while a block runs, the next one is
            # gathered beside it (prefetch, which a GPU overlaps with compute)
            in_blocks = sum(g.params_per_block * g.count for g in spec.blocks)
            root = max(spec.total_params - in_blocks, 0) * run.precision.weight_bytes
            gathered = root + per_block * dt.compute
            block_gathered = (shard.gathered_blocks - 1) * per_block * dt.compute
            # a block's backward makes its whole (unsharded) gradients before they are
            # reduce-scattered into the shard (adapters' only, under LoRA: negligible); they
            # have the parameters' own shapes, without the gather's padding
            if setup.method is Method.FULL:
                unpadded = max((g.params_per_block for g in spec.blocks), default=0)
                block_gradients = unpadded * dt.compute
                root_gradients = root
                # the root's gradients stay whole until the root's reduce-scatter at the
                # end of backward; the head's is made first
                if spec.is_causal_lm:
                    root_head_gradient = spec.vocab_size * spec.hidden_size * dt.compute
    extra_fwd = gathered
    # the root unit resharded as the model's forward returns (torchtune's explicit
    # reshard_after_forward on torch >= 2.8): the loss and its backward run without it, and
    # without the last all-gather's buffer, which the forward's root frees as it returns
    # (torch 2.13 _fsdp_state.py:333-342, in older releases too; measured on 2.13 only, so
    # a root kept whole keeps the shared rule)
    root_away = root if root and stack.fsdp_root_resharded(run) else 0
    last_gather = gathered - root if root and stack.fsdp_loss_without_last_gather else 0
    gone_after_forward = root_away + last_gather
    # the embeddings and the head as FSDP units of their own (torchtune's
    # custom_sharded_layers), resharded after their own forward and backward: the head is
    # gathered again for its backward only, the embeddings at the very end; the blocks'
    # backward holds neither (measured: torchtune's 8B_full setting on CPU ranks)
    own = set(setup.distributed.fsdp_own_units) if root_away and spec.is_causal_lm else set()
    if spec.tie_word_embeddings:
        own = set()  # one tied weight cannot be two units
    unit_bytes = spec.vocab_size * spec.hidden_size * run.precision.weight_bytes
    embeddings_own = unit_bytes if "embeddings" in own else 0
    head_own = unit_bytes if "head" in own else 0
    held_back = extra_fwd - embeddings_own - head_own
    ddp_buckets = st.gradients.bytes if shard.gradient_buckets else 0
    zero = zero_buffers(spec, setup, shard, st)
    # ZeRO-3 allocates its bucket with the optimizer and keeps it; ZeRO-1/2 from the first
    # gradient hook to the end of backward
    always = zero.bucket if zero.persistent else 0
    in_backward = zero.bucket

    grads_kept = (
        setup.grad_accum > 1 or not setup.zero_grad_frees_gradients or zero.persistent_gradients
    )
    grads_between = st.gradients.bytes if grads_kept else 0
    grads_text = (
        st.gradients.formula
        + (
            " (DeepSpeed's flat gradient partition, kept)"
            if zero.persistent_gradients
            else " (kept across accumulation)"
            if setup.grad_accum > 1
            else " (zeroed in place, never freed)"
        )
        if grads_between
        else "none yet (set to None after each step)"
    )
    states = st.states
    if setup.first_step:
        states = Term(bytes=0, formula="none before the first step")
        notes.append("first step: optimizer states are created inside it")

    def phase(ph: Phase, moment: str, parts: dict[Component, Term]) -> PhaseBudget:
        return PhaseBudget(
            phase=ph,
            moment=moment,
            components={k: v for k, v in parts.items() if v.bytes or k in (Component.WEIGHTS,)},
        )

    temp_fwd = Term(
        bytes=extra_fwd + ddp_buckets + always,
        formula=temporaries_text(gathered, ddp_buckets, shard, zero.text if always else ""),
    )
    forward_only = (
        forward_only_terms(spec, run, inv)
        + ([vision.forward_only] if vision else [])
        + logits_shard(whole_model, run, dt.compute)
    )
    forward_temp = Term(
        bytes=temp_fwd.bytes + sum(t.bytes for t in forward_only),
        formula=" + ".join(
            [temp_fwd.formula] * bool(temp_fwd.bytes) + [t.formula for t in forward_only]
        )
        or "none",
    )
    # what every moment of forward holds besides its activations and temporaries
    in_forward = {
        Component.WEIGHTS: st.weights,
        Component.WEIGHT_COPIES: Term(bytes=copies_fwd, formula=copies_text),
        Component.GRADIENTS: Term(bytes=grads_between, formula=grads_text),
        Component.OPTIMIZER_STATES: states,
    }
    after_forward_temp = forward_temp
    if gone_after_forward:
        after_forward_temp = Term(
            bytes=forward_temp.bytes - gone_after_forward,
            formula=forward_temp.formula
            + (
                " − all of it (resharded and freed as forward returns)"
                if root_away
                else " − the last block's (freed as forward returns)"
            ),
        )
    forward = phase(
        Phase.FORWARD,
        "end of forward, loss computed",
        {
            **in_forward,
            Component.ACTIVATIONS: activations,
            Component.LOGITS: Term(bytes=logits.forward_end, formula=logits.formula_forward),
            Component.TEMPORARIES: after_forward_temp,
        },
    )
    in_flight = attention_in_flight(spec, whole, setup, dt.compute)
    if in_flight is not None:
        forward = max(
            forward,
            phase(
                Phase.FORWARD,
                "attention of the last block, the whole sequence's keys and values at hand",
                {
                    **in_forward,
                    Component.ACTIVATIONS: activations,
                    Component.TEMPORARIES: plus_term(temp_fwd, in_flight.forward),
                },
            ),
            key=lambda p: p.allocated_bytes,
        )
    vision_forward, vision_backward = vision_phase_parts(vision, in_forward, temp_fwd, st.gradients)
    for moment, parts in vision_forward:
        forward = max(forward, phase(Phase.FORWARD, moment, parts), key=lambda p: p.allocated_bytes)
    if logits.after_forward:
        # the trainer's own work on the outputs (TRL SFTTrainer's metrics), forward returned
        left = logits.copies_after_forward
        metrics = phase(
            Phase.FORWARD,
            "after forward: the trainer's metrics on the outputs",
            {
                **in_forward,
                Component.WEIGHT_COPIES: Term(bytes=copies_fwd, formula=copies_text)
                if left is None
                else Term(bytes=left, formula="autocast's cast of the head, kept by its matmul"),
                Component.ACTIVATIONS: activations,
                Component.LOGITS: Term(
                    bytes=logits.after_forward, formula=logits.formula_after_forward
                ),
                Component.TEMPORARIES: temp_fwd,
            },
        )
        forward = max(forward, metrics, key=lambda p: p.allocated_bytes)
    dequantized = f" + {copies_text}" if copies_block else ""
    # a checkpointed block's forward keeps nothing, but holds its own tensors while it runs:
    # at its MLP (where its largest Linears are) its residual, its MLP's input, one more
    # N·h-wide tensor and one MLP-wide one (a dequantized NF4 weight's moment, measured on
    # the CPU within 0.1%)
    running = 3 * dt.residual * n_h + dt.linear_out_bytes * setup.tokens * spec.intermediate_size
    running_text = (
        f"the running block's residual, MLP input and one more tensor (3·{dt.residual}·N·h) "
        f"and one MLP-wide ({dt.linear_out_bytes}·N·I)"
    )
    if offloaded:
        # inside a block: its tensors are made on the device and leave as they are saved
        held, held_text = recompute, f"one block's tensors ({format_bytes(recompute)})"
        if own_offload is not None and setup.grad_ckpt:
            held, held_text = running, running_text
        inside = phase(
            Phase.FORWARD,
            "forward of a block, its saved tensors leaving for the host",
            {
                **in_forward,
                Component.ACTIVATIONS: own_offload.in_forward
                if own_offload is not None
                else activations,
                Component.TEMPORARIES: Term(
                    bytes=forward_temp.bytes + held + copies_block,
                    formula=held_text + dequantized,
                ),
            },
        )
        forward = max(forward, inside, key=lambda p: p.allocated_bytes)
    elif copies_block:
        # inside the last block's forward, a quantized weight dequantized for its matmul: the
        # blocks' saved tensors (under checkpointing their inputs, and the running block's)
        blocks_saved = max(saved - acts.outside.evaluate(acts.dims), 0)
        inside = phase(
            Phase.FORWARD,
            "forward of the last block, a quantized weight dequantized",
            {
                **in_forward,
                Component.ACTIVATIONS: Term(
                    bytes=blocks_saved + (running if setup.grad_ckpt else 0),
                    formula="the blocks' saved tensors"
                    + (f" (their inputs) + {running_text}" if setup.grad_ckpt else ""),
                ),
                Component.TEMPORARIES: Term(
                    bytes=forward_temp.bytes + copies_block, formula=copies_text
                ),
            },
        )
        forward = max(forward, inside, key=lambda p: p.allocated_bytes)
    if root:
        # FSDP gathers the root unit as forward starts: its all-gather buffer and the
        # parameters copied out of it are both alive for a moment. Measured on torchtune's
        # distributed recipe (FSDP2 on CPU ranks): the root's buffer is still alive while the
        # first block is gathered (freed once the next all-gather is waited on), that block's
        # buffer and copied-out parameters too; the HF Trainer's FSDP keeps its checked rule
        first_gathered = block_gathered if root_away else 0
        root_gather = phase(
            Phase.FORWARD,
            "start of forward: the root unit and the first block gathered"
            if first_gathered
            else "start of forward: the root unit gathered",
            {
                **in_forward,
                Component.TEMPORARIES: Term(
                    bytes=forward_temp.bytes + root + first_gathered,
                    formula=temporaries_text(gathered, ddp_buckets, shard)
                    + " + the root unit's all-gather buffer"
                    + (" + the first block's" if first_gathered else ""),
                ),
            },
        )
        forward = max(forward, root_gather, key=lambda p: p.allocated_bytes)
    if block_gathered:
        # inside the last block's forward: the blocks' activations, no head or logits yet
        # (under checkpointing, the running block's own tensors until it returns)
        in_blocks = max(saved - acts.outside.evaluate(acts.dims), 0) + recompute
        last_block = phase(
            Phase.FORWARD,
            "forward of the last block, gathered with the one before",
            {
                **in_forward,
                Component.ACTIVATIONS: Term(bytes=in_blocks, formula="the blocks' saved tensors"),
                Component.TEMPORARIES: Term(
                    bytes=forward_temp.bytes + block_gathered,
                    formula=temporaries_text(gathered, ddp_buckets, shard, blocks=True),
                ),
            },
        )
        forward = max(forward, last_block, key=lambda p: p.allocated_bytes)
        blocks = sum(g.count for g in spec.blocks)
        if blocks >= 2:
            # while the last block but one runs, FSDP2 holds its all-gather buffer (kept until
            # the next all-gather is issued) besides the parameters copied out of it, and the
            # last block prefetched in its own buffer, not yet copied out: three blocks'
            # worth, with the saved tensors of the blocks so far (simulated rank)
            per_blocks = max(saved - acts.outside.evaluate(acts.dims), 0)
            so_far = per_blocks * (blocks - 1) // blocks + recompute
            prefetch = phase(
                Phase.FORWARD,
                "forward of the last block but one, the last one prefetched",
                {
                    **in_forward,
                    Component.ACTIVATIONS: Term(
                        bytes=so_far, formula="the saved tensors of the blocks so far"
                    ),
                    Component.TEMPORARIES: Term(
                        bytes=forward_temp.bytes + 2 * block_gathered,
                        formula=temporaries_text(gathered, ddp_buckets, shard, blocks=True)
                        + " + the next block's all-gather buffer",
                    ),
                },
            )
            forward = max(forward, prefetch, key=lambda p: p.allocated_bytes)

    head_grad_new = 0 if grads_between else st.head_gradient
    if root_head_gradient:
        head_grad_new = root_head_gradient
    # the gradients once the head's backward is done
    after_head = Term(
        bytes=grads_between + head_grad_new,
        formula="the head's gradient"
        + (" (whole: FSDP reduces the root unit's at the end)" if root_head_gradient else "")
        if head_grad_new
        else grads_text,
    )
    backward_moments = [
        (
            logits.moment_backward,
            {
                Component.LOGITS: Term(
                    bytes=logits.backward_start, formula=logits.formula_backward
                ),
                Component.GRADIENTS: Term(bytes=grads_between, formula=grads_text),
                Component.ACTIVATIONS: activations,
                Component.WEIGHT_COPIES: Term(bytes=copies_bwd, formula=copies_text),
                Component.TEMPORARIES: Term(
                    bytes=temp_fwd.bytes - gone_after_forward,
                    formula=temp_fwd.formula
                    + (
                        " − all of it (resharded and freed after forward)"
                        if root_away
                        else " − the last block's (freed after forward)"
                        if gone_after_forward
                        else ""
                    ),
                ),
            },
        ),
        (
            "head backward: logits gradient and the head's weight gradient",
            {
                Component.LOGITS: Term(bytes=logits.head_backward, formula=logits.formula_head),
                Component.GRADIENTS: after_head,
                Component.ACTIVATIONS: activations,
                Component.WEIGHT_COPIES: Term(
                    bytes=copies_bwd
                    + (te_head_gradient_bytes(spec, run) if setup.float8_te else 0),
                    formula=copies_text,
                ),
                # FSDP: the root's backward prefetches the last block, in the all-gather
                # buffer forward's last block left (freed at the root's post-forward)
                Component.TEMPORARIES: Term(
                    bytes=temp_fwd.bytes - embeddings_own,
                    formula=temp_fwd.formula
                    + (" − the embeddings (a unit of their own)" if embeddings_own else ""),
                ),
            },
        ),
    ]
    if root_away:
        # backward reaches the head's outputs (every chunk's loss done): the root unit is
        # gathered again, its all-gather buffer and the parameters copied out of it both alive
        backward_moments.append(
            (
                "head backward starts: the root unit gathered again",
                {
                    Component.LOGITS: Term(
                        bytes=dt.compute * logits_count(spec, run),
                        formula=f"{dt.compute} B × N·V: the logits' gradient",
                    ),
                    Component.GRADIENTS: Term(bytes=grads_between, formula=grads_text),
                    Component.ACTIVATIONS: activations,
                    Component.WEIGHT_COPIES: Term(bytes=copies_bwd, formula=copies_text),
                    # the copy-out's moment: the last block is prefetched after it
                    Component.TEMPORARIES: Term(
                        bytes=2 * (root_away - embeddings_own),
                        formula="the root unit gathered again: its all-gather buffer and the "
                        "parameters copied out of it"
                        + (" (not the embeddings: a unit of their own)" if embeddings_own else ""),
                    ),
                },
            )
        )
    if in_backward and not always:
        backward_moments.append(
            (
                "first gradient hook: DeepSpeed allocates its reduction bucket",
                {
                    Component.GRADIENTS: after_head,
                    Component.ACTIVATIONS: activations,
                    Component.TEMPORARIES: Term(
                        bytes=temp_fwd.bytes + in_backward,
                        formula=" + ".join([temp_fwd.formula] * bool(temp_fwd.bytes) + [zero.text]),
                    ),
                },
            )
        )
    retained, retained_text = fsdp1_retained_inputs(spec, run)
    if copies_block and not (setup.grad_ckpt or offloaded):
        # the last block's backward dequantizes its weights with every block's saved tensors
        # still alive (the final norm's and the head's given back) and its output's gradient
        backward_moments.append(
            (
                "backward of the last block, a quantized weight dequantized",
                {
                    Component.GRADIENTS: after_head,
                    Component.ACTIVATIONS: Term(
                        bytes=activations.bytes - acts.final_bytes,
                        formula=activations.formula + " − the final norm's and head's",
                    ),
                    Component.TEMPORARIES: Term(
                        bytes=dt.residual * n_h + copies_block + temp_fwd.bytes,
                        formula=f"{dt.residual}·N·h (the block's output gradient) + {copies_text}",
                    ),
                },
            )
        )
    if setup.grad_ckpt or offloaded:
        backward_moments.append(
            (
                "recompute of the last block"
                if setup.grad_ckpt
                else "the last block's saved tensors brought back",
                {
                    Component.GRADIENTS: after_head,
                    Component.ACTIVATIONS: Term(
                        bytes=activations.bytes - acts.final_bytes,
                        formula=activations.formula + " − the final norm's and head's (given back)",
                    )
                    if setup.grad_ckpt and not offloaded
                    else own_offload.in_backward
                    if own_offload is not None
                    else activations,
                    Component.WEIGHT_COPIES: Term(bytes=copies_recompute, formula=copies_text),
                    Component.TEMPORARIES: Term(
                        bytes=recompute
                        + workspace
                        + held_back
                        + block_gathered
                        + ddp_buckets
                        + in_backward
                        + retained,
                        formula=f"one block {'recomputed' if setup.grad_ckpt else 'brought back'}"
                        f" ({format_bytes(recompute)}) + "
                        f"{workspace_text}"
                        + (f" + {zero.text}" if in_backward else "")
                        + (f" + {retained_text}" if retained else ""),
                    ),
                },
            )
        )
    first_block = acts.largest_block_bytes if not setup.grad_ckpt else recompute
    # The token embedding is the last weight backward reaches: while the first block's
    # gradients are computed, its gradient does not exist yet. With tied input and output
    # embeddings, the head's contribution waits in autograd's buffer until then, and the two
    # are summed into a third tensor before the weight's .grad takes it.
    embedding = (
        spec.vocab_size * spec.hidden_size * setup.precision.weight_bytes
        if setup.method is Method.FULL
        and spec.is_causal_lm
        and not grads_kept
        and not setup.distributed.is_multi_gpu
        and not setup.optimizer_in_backward
        else 0
    )
    tied_extra = 2 * embedding if spec.tie_word_embeddings else 0
    # the first block's own gradients: as its backward runs its MLP (its saved tensors all
    # alive) only the MLP output projection's weight gradient exists, the first one backward
    # makes in a block; counting them all beside its saved tensors read the moment 4-5% high
    # where the blocks weigh most (a reward model's score head)
    first_to_come = (
        first_block_gradients_to_come(spec, inv)
        if setup.method is Method.FULL
        and not grads_kept
        and not setup.distributed.is_multi_gpu
        and not setup.optimizer_in_backward
        else 0
    )
    blocks = sum(g.count for g in spec.blocks)
    in_blocks_saved = max(saved - acts.outside.evaluate(acts.dims), 0)
    if block_gathered and blocks >= 2:
        backward_moments += fsdp_block_moments(
            spec,
            st,
            blocks=blocks,
            saved=in_blocks_saved,
            recompute=recompute,
            workspace=(workspace, workspace_text),
            gathered=held_back,
            gathered_text=temporaries_text(gathered, 0, shard, blocks=True),
            block_gathered=block_gathered,
            block_gradients=block_gradients,
            input_gradient=2 * dt.residual * n_h,
            # the head a unit of its own: its gradient reduced as its backward ends
            head_gradient=0 if head_own else root_head_gradient,
            grads_between=Term(bytes=grads_between, formula=grads_text),
        )
    if block_gradients:
        backward_moments += fsdp_last_moments(
            spec,
            st,
            first_block=first_block,
            workspace=(workspace, workspace_text),
            held=held_back + block_gathered + (0 if head_own else root_head_gradient),
            held_text=temporaries_text(gathered, 0, shard, blocks=True)
            + " (the block before's reduce-scatter input) + the head's whole gradient",
            block_gradients=block_gradients,
            input_gradient=2 * dt.residual * n_h,
            root_backward=extra_fwd + root_gradients,
            root_text=temporaries_text(gathered, 0, shard)
            + " (the block's: the last reduce-scatter input) + the root unit's whole gradients",
            tied=2 * spec.vocab_size * spec.hidden_size * dt.compute
            if spec.tie_word_embeddings and spec.is_causal_lm
            else 0,
            root_reduce=root_reduce_scatter(root, shard, setup, root_head_gradient),
        )
    else:
        backward_moments.append(
            (
                "backward of the first block",
                {
                    Component.GRADIENTS: Term(
                        bytes=st.gradients.bytes - embedding - first_to_come,
                        formula=st.gradients.formula
                        + (" − the token embedding's (still to come)" if embedding else "")
                        + (
                            " − the first block's own but its MLP output projection's"
                            if first_to_come
                            else ""
                        ),
                    ),
                    Component.ACTIVATIONS: Term(
                        bytes=first_block + (vision.saved.bytes if vision is not None else 0),
                        formula="the first block's saved tensors"
                        + (" + the vision encoder's" if vision and vision.saved.bytes else ""),
                    )
                    if own_offload is None
                    else Term(
                        bytes=first_block + own_offload.in_backward.bytes,
                        formula="the first block's saved tensors + "
                        + own_offload.in_backward.formula,
                    ),
                    Component.TEMPORARIES: Term(
                        bytes=workspace
                        + held_back
                        + block_gathered
                        + ddp_buckets
                        + in_backward
                        + copies_block,
                        formula=workspace_text
                        + (
                            f" + {temporaries_text(gathered, 0, shard, blocks=True)}"
                            if block_gathered
                            else ""
                        )
                        + (f" + {zero.text}" if in_backward else "")
                        + dequantized,
                    ),
                },
            )
        )
        backward_moments.append(
            (
                "end of backward: every gradient complete",
                {
                    Component.GRADIENTS: st.gradients,
                    Component.TEMPORARIES: Term(
                        bytes=tied_extra + extra_fwd + ddp_buckets + in_backward,
                        formula="the head's and the embedding's gradients of the tied weight, "
                        "summed into it"
                        if tied_extra
                        else temporaries_text(gathered, ddp_buckets, shard, zero.text),
                    ),
                },
            )
        )
    if setup.optimizer_in_backward:
        # the largest parameter (the head or the embedding) is stepped in its hook while
        # backward still holds every saved tensor below it
        backward_moments.append(
            (
                "the largest parameter stepped in its hook",
                {
                    Component.GRADIENTS: st.gradients,
                    Component.ACTIVATIONS: activations,
                    Component.TEMPORARIES: Term(
                        bytes=st.step_temporaries.bytes + temp_fwd.bytes,
                        formula=st.step_temporaries.formula,
                    ),
                },
            )
        )
    backward_moments += vision_backward
    backward_candidates = []
    for moment, parts in backward_moments:
        full = {Component.WEIGHTS: st.weights, Component.OPTIMIZER_STATES: states, **parts}
        backward_candidates.append(phase(Phase.BACKWARD, moment, full))
    if in_flight is not None:
        # a block's backward runs its attention's backward: the keys and values in flight
        # come on top of what each moment inside a block holds
        no_temporaries = Term(bytes=0, formula="")
        backward_candidates += [
            phase(
                Phase.BACKWARD,
                f"{candidate.moment}, its attention's keys and values in flight",
                {
                    **candidate.components,
                    Component.TEMPORARIES: plus_term(
                        candidate.components.get(Component.TEMPORARIES, no_temporaries),
                        in_flight.backward,
                    ),
                },
            )
            for candidate in backward_candidates
            if "block" in candidate.moment
        ]
    backward = max(backward_candidates, key=lambda p: p.allocated_bytes)

    step_parts = {
        Component.WEIGHTS: st.weights,
        Component.GRADIENTS: st.gradients,
        Component.OPTIMIZER_STATES: st.states,
        Component.TEMPORARIES: step_temporaries(st, ddp_buckets, zero, always),
    }
    if setup.optimizer_in_backward:
        step_parts = {
            Component.WEIGHTS: st.weights,
            Component.OPTIMIZER_STATES: st.states,
        }
    optimizer_step = phase(
        Phase.OPTIMIZER_STEP,
        "after backward: every parameter already stepped in its hook"
        if setup.optimizer_in_backward
        else "inside the optimizer step",
        step_parts,
    )
    if st.persistent_bytes:
        # ZeRO-3 partitions every parameter as the step starts and gathers the persistent
        # ones again after it (measured): inside the step without their whole copies, after
        # it with them and without the step's buffers
        weights_in_step = Term(
            bytes=st.weights.bytes - st.persistent_bytes,
            formula=st.weights.formula + ", less the whole copies: partitioned for the step",
        )
        after = Term(bytes=always, formula=zero.text if always else "none")
        optimizer_step = max(
            phase(
                Phase.OPTIMIZER_STEP,
                "inside the optimizer step",
                {**step_parts, Component.WEIGHTS: weights_in_step},
            ),
            phase(
                Phase.OPTIMIZER_STEP,
                "after the step: persistent parameters gathered again",
                {**step_parts, Component.TEMPORARIES: after},
            ),
            key=lambda p: p.allocated_bytes,
        )

    phases = with_pixel_values([forward, backward, optimizer_step], spec, run)
    peak = max(phases, key=lambda p: p.allocated_bytes)
    first_step_peak = None
    if with_first_step and not setup.first_step:
        first = estimate_budget(whole_model, replace(whole, first_step=True), gpu)
        first_step_peak = first.allocated_peak_bytes

    transient = sum(
        term.bytes
        for comp, term in peak.components.items()
        if comp in (Component.ACTIVATIONS, Component.TEMPORARIES, Component.WEIGHT_COPIES)
    )
    # the big persistent tensors each waste up to a segment's rounding: parameters, their
    # gradients and states, and the per-block activations
    live_tensors = sum(g.tensors for g in inv.groups if g.numel * g.bytes_per_param > 2**20)
    cached = cached_at_the_loss(spec, run, setup, phases, peak, recompute, acts, logits)
    hole = own_loss.hole_bytes if own_loss is not None else logits_hole(spec, setup)
    overheads = overhead_terms(setup, transient, live_tensors, hole, cached)
    load_reserved = getattr(stack, "load_reserved", None)
    if load_reserved is not None:
        load = load_reserved(spec, setup, st.weights.bytes)
        overheads = with_load_kept(overheads, peak.allocated_bytes, load)
    reserved, device_total = reserved_and_device_total(peak.allocated_bytes, overheads)
    if st.unified_bytes and not setup.first_step:
        resident = unified_memory(st.unified_bytes, device_total, gpu)
        overheads[Overhead.UNIFIED_MEMORY] = resident
        device_total += resident.bytes
    if shard.shard_group > 1:
        notes.append(f"per device, {shard.label}")
    if not spec.supports_sdpa and setup.attn is not None and setup.attn.value != "eager":
        notes.append(
            f"{spec.model_type} trains with eager attention in transformers "
            "(SDPA refused): its softmax keeps b·a·s² fp32 scores per block"
        )
    return Budget(
        phases=phases,
        peak_phase=peak.phase,
        allocated_peak_bytes=peak.allocated_bytes,
        overheads=overheads,
        reserved_peak_bytes=reserved,
        device_total_bytes=device_total,
        first_step_allocated_peak_bytes=first_step_peak,
        gpu=gpu,
        params=inv.params,
        trainable_params=inv.trainable_params,
        notes=notes,
        band_class=band_class(setup),
        unified_memory_bytes=0 if setup.first_step else st.unified_bytes,
    )
