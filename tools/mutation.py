"""Mutation testing of rollserve's core, one module at a time (mutmut 3): do the tests notice a slip?

Each core module is mutated in a scratch copy of the repository (``.mutation/<module>/``, gitignored)
and each mutant is checked only against the tests that cover the mutated function, drawn from that
module's own test files, so a module takes minutes on 2 cores, not hours. The score is killed
(including timeouts) over all mutants, less those listed as equivalent in ``docs/testing.md``.

    pip install "mutmut>=3,<4"
    python tools/mutation.py                      # every core module, one after the other
    python tools/mutation.py --module wire --module rtc
    python tools/mutation.py --module wire --survivors   # list what survived (with diffs)

Not part of CI (too slow); run it before a change to a core module lands (docs/testing.md).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"
DOCS = ROOT / "docs" / "testing.md"
READ_BY_TESTS = ("docs", "examples")  # trees some tests read: docs/rollout.md's table, the examples


@dataclass(frozen=True)
class CoreModule:
    """Source files to mutate and the test files that are meant to catch a slip in them."""

    sources: tuple[str, ...]
    tests: tuple[str, ...]
    pytest_args: tuple[str, ...] = ()
    fork_server: bool = False  # torch is not fork-safe: fork mutants from a clean server process


MODULES: dict[str, CoreModule] = {
    "wire": CoreModule(("src/rollserve/wire/*.py",), ("tests/wire",), ("--hypothesis-profile=mutation",)),
    "rtc": CoreModule(("src/rollserve/rtc/*.py",), ("tests/rtc",)),
    # The timing-robustness variants (late worker) are left out: the same tests run with a prompt
    # worker. The inline tests read a fake clock (the model's cost is set, not measured), so tracing
    # slows nothing they check.
    "engine": CoreModule(
        ("src/rollserve/engine/batcher.py",),
        ("tests/engine",),
        ("-k", "not late-worker"),
    ),
    "request_path": CoreModule(
        ("src/rollserve/engine/request_path.py",),
        (
            "tests/server/test_policy_service.py",
            "tests/server/test_request_path.py",
            "tests/server/test_policy_inflight_replacement.py",
        ),
    ),
    "rollout": CoreModule(
        ("src/rollserve/server/rollout/service.py", "src/rollserve/server/rollout/store.py"),
        (
            "tests/server/test_rollout_service.py",
            "tests/server/test_rollout_service_rules.py",
            "tests/server/test_rollout_store.py",
            "tests/server/test_rollout_retries_and_refusals.py",
            "tests/server/test_rollout_create_conflict.py",
            "tests/server/test_rollout_review_service.py",
            "tests/client/test_rollout_client_aliases.py",
            "tests/server/test_rollout_status_idle.py",
            "tests/server/test_rollout_start_state_refusals.py",
            "tests/server/test_rollout_batch_item_validation.py",
            "tests/scale/test_shared_store.py",
            "tests/scale/test_shared_store_forks.py",
            "tests/server/test_rollout_idle_clock_after_slow_requests.py",
            "tests/server/test_rollout_bool_floats.py",
            "tests/server/test_rollout_batch_columns.py",
        ),
        # a start-state test loads the video world: forked after torch ran, a mutant's run hung in torch
        fork_server=True,
    ),
    # The replicas' shared session store and its table, without Ray: replicas are RolloutService
    # instances in one process over one SessionTable (test_ray_table.py needs Ray: left out)
    "shared_store": CoreModule(
        ("src/rollserve/scale/store.py", "src/rollserve/scale/table.py"),
        (
            "tests/scale/test_shared_store.py",
            "tests/scale/test_shared_store_forks.py",
            "tests/scale/test_shared_store_review.py",
        ),
    ),
    # The deployment's /metrics: the replicas' reports merged (test_ray_serve.py needs Ray: left out)
    "scale_metrics": CoreModule(
        ("src/rollserve/scale/metrics.py",),
        ("tests/scale/test_merged_metrics.py", "tests/scale/test_scale_metrics_review.py"),
    ),
    "auth": CoreModule(("src/rollserve/server/auth.py",), ("tests/server/test_auth.py",)),
    "penalty": CoreModule(
        ("src/rollserve/server/penalty.py",),
        (
            "tests/server/test_refusal_penalty.py",
            "tests/server/test_penalty_review.py",
            "tests/server/test_http_pipelined_refusals.py",
        ),
    ),
    "world": CoreModule(
        ("src/rollserve/models/world.py",),
        (
            "tests/models/test_world_protocol.py",
            "tests/models/test_video_world_bounds.py",
            "tests/server/test_rollout_service.py",
            "tests/server/test_rollout_service_rules.py",
            "tests/server/test_rollout_start_state_exact.py",
            "tests/server/test_rollout_start_state_refusals.py",
            "tests/server/test_video_world_published_bounds.py",
            "tests/client/test_rollout_client.py",
            "tests/client/test_rollout_env.py",
        ),
        fork_server=True,  # the start-state and bounds tests load the video world (torch)
    ),
    "video_world": CoreModule(
        ("src/rollserve/models/video_world.py",),
        (
            "tests/models/test_video_world.py",
            "tests/models/test_video_world_tracks_the_simulator.py",
            "tests/models/test_video_world_bounds.py",
            "tests/models/test_world_checkpoint_checks.py",
            "tests/models/test_world_action_state.py",
            "tests/server/test_rollout_video_world.py",
            "tests/server/test_video_world_published_bounds.py",
            "tests/training/test_world_training_review.py",
            "tests/models/test_video_world_review.py",
        ),
        fork_server=True,
    ),
    "app": CoreModule(
        ("src/rollserve/server/app.py", "src/rollserve/server/rollout/status_codes.py"),
        (
            "tests/server/test_auth.py",
            "tests/server/test_app_deployment_view.py",
            "tests/server/test_rollout_direct_dispatch.py",
            "tests/server/test_rollout_openapi.py",
            "tests/server/test_rollout_status_codes.py",
            "tests/server/test_rollout_routes.py",
            "tests/server/test_policy_routes.py",
            "tests/server/test_rollout_review_bodies.py",
            "tests/server/test_rollout_bodyless_routes.py",
            "tests/client/test_rollout_typed_server_errors.py",
            "tests/server/test_app_review.py",
        ),
        fork_server=True,  # the policy routes' tests load a torch policy
    ),
    "policy": CoreModule(
        (
            "src/rollserve/server/policy/sessions.py",
            "src/rollserve/server/policy/service.py",
            "src/rollserve/server/policy/connections.py",
        ),
        (
            "tests/server/test_policy_service.py",
            "tests/server/test_policy_epochs.py",
            "tests/server/test_policy_inflight_replacement.py",
            "tests/server/test_policy_connection_order.py",
            "tests/server/test_policy_connection_refusals.py",
            "tests/server/test_connection_guards.py",
            "tests/server/test_policy_routes.py",
            "tests/server/test_policy_hostile.py",
            "tests/server/test_policy_service_review.py",
            "tests/server/test_policy_connections_review.py",
        ),
        fork_server=True,  # the routes' tests load a torch policy
    ),
    "robot_loop": CoreModule(
        ("src/rollserve/client/inference_loop.py",),
        (
            "tests/client/test_inference_engine.py",
            "tests/client/test_inference_engine_health_and_horizon.py",
            "tests/client/test_inference_engine_races.py",
            "tests/client/test_inference_loop_review.py",
            "tests/client/test_engine_backoff_and_frame_limit.py",
            "tests/client/test_engine_reset_retry.py",
            "tests/client/test_engine_restart.py",
            "tests/client/test_remote_engine_failures.py",
            "tests/rtc/test_latency.py",
        ),
        fork_server=True,
    ),
    "http_guard": CoreModule(
        ("src/rollserve/server/http_guard.py",),
        (
            "tests/server/test_connection_guards.py",
            "tests/server/test_http_guard_review.py",
            "tests/server/test_http_guard_trickle.py",
            "tests/server/test_http_pipelined_refusals.py",
            "tests/server/test_refusal_penalty.py",  # each connection's refusal streak, in its scope
            "tests/server/test_penalty_review.py",
        ),
        fork_server=True,
    ),
    "rollout_client": CoreModule(
        ("src/rollserve/client/rollout_client.py",),
        (
            "tests/client/test_rollout_client.py",
            "tests/client/test_rollout_client_aliases.py",
            "tests/client/test_rollout_client_body_timeout_retry.py",
            "tests/client/test_rollout_faults.py",
            "tests/client/test_rollout_proxy_errors.py",
            "tests/client/test_rollout_reply_decoding.py",
            "tests/client/test_rollout_typed_server_errors.py",
            "tests/client/test_rollout_vllm_omni_errors.py",
            "tests/server/test_rollout_batch_columns.py",  # the client's columns path, end to end
            "tests/client/test_rollout_frames_writable.py",
            "tests/client/test_rollout_client_review.py",
        ),
        fork_server=True,  # the servers these tests start load torch worlds
    ),
    "ws_protocol": CoreModule(
        ("src/rollserve/server/ws_protocol.py",),
        (
            "tests/server/test_ws_protocol.py",
            "tests/server/test_ws_oversized_close.py",
            "tests/client/test_policy_client_frame_limit_race.py",
            "tests/client/test_policy_client_frame_too_large_after_reset.py",
            "tests/server/test_ws_protocol_review.py",
        ),
    ),
    "policy_client": CoreModule(
        ("src/rollserve/client/policy_client.py",),
        (
            "tests/client/test_policy_client.py",
            "tests/client/test_policy_client_call_timeout.py",
            "tests/client/test_policy_client_close.py",
            "tests/client/test_policy_client_frame_limit_race.py",
            "tests/client/test_policy_client_frame_too_large_after_reset.py",
            "tests/client/test_policy_client_refusal_hints.py",
            "tests/client/test_policy_client_send_timeout.py",
            "tests/client/test_engine_backoff_and_frame_limit.py",
            "tests/client/test_remote_engine_failures.py",
            "tests/server/test_policy_connection_refusals.py",
            "tests/server/test_wire_errors_over_socket.py",
            "tests/client/test_policy_client_review.py",
        ),
        fork_server=True,  # some of these tests serve a torch policy
    ),
    "rollout_protocol": CoreModule(
        ("src/rollserve/server/rollout/protocol.py",),
        (
            "tests/server/test_rollout_protocol.py",
            "tests/server/test_rollout_action_required.py",
            "tests/server/test_rollout_fast_paths.py",
            "tests/server/test_rollout_bool_floats.py",
            "tests/server/test_rollout_batch_item_validation.py",
            "tests/server/test_rollout_start_state_refusals.py",
            "tests/server/test_rollout_batch_columns.py",
            "tests/server/test_rollout_review_bodies.py",
            "tests/server/test_rollout_protocol_review.py",
        ),
        fork_server=True,  # some of these tests serve torch worlds
    ),
    "learned_world": CoreModule(
        ("src/rollserve/models/learned_world.py",),
        (
            "tests/models/test_learned_world.py",
            "tests/models/test_world_checkpoint_checks.py",
            "tests/models/test_world_action_state.py",
            "tests/server/test_serve_trained_world.py",
            "tests/models/test_learned_world_review.py",
        ),
        fork_server=True,  # torch worlds
    ),
    "rollout_env": CoreModule(
        ("src/rollserve/client/rollout_env.py",),
        (
            "tests/client/test_rollout_env.py",
            "tests/client/test_rollout_env_held_ends.py",
            "tests/client/test_rollout_env_lost_replies.py",
            "tests/client/test_rollout_env_lost_sessions.py",
            "tests/client/test_rollout_env_recovery.py",
            "tests/client/test_rollout_env_render_mode.py",
            "tests/client/test_rollout_vector_env_infos.py",
            "tests/client/test_rollout_frames_writable.py",
            "tests/server/test_rollout_batch_columns.py",
            "tests/client/test_rollout_env_review.py",
        ),
        fork_server=True,  # the servers these tests start load torch worlds
    ),
    "policy_routes": CoreModule(
        ("src/rollserve/server/policy/routes.py",),
        (
            "tests/server/test_policy_routes.py",
            "tests/server/test_policy_openpi.py",
            "tests/server/test_policy_hostile.py",
            "tests/server/test_policy_connection_refusals.py",
            "tests/server/test_policy_connection_order.py",
            "tests/server/test_wire_errors_over_socket.py",
            "tests/server/test_policy_inflight_replacement.py",
            "tests/server/test_policy_connections_review.py",
            "tests/server/test_refusal_penalty.py",  # a connection's refusal streak (`_Refusals`)
            "tests/server/test_policy_routes_review.py",
        ),
        fork_server=True,  # the routes' tests load a torch policy
    ),
    "rollout_routes": CoreModule(
        ("src/rollserve/server/rollout/routes.py", "src/rollserve/server/rollout/batch_peek.py"),
        (
            "tests/server/test_rollout_routes.py",
            "tests/server/test_rollout_status_codes.py",
            "tests/server/test_rollout_review_bodies.py",
            "tests/server/test_rollout_bodyless_routes.py",
            "tests/server/test_rollout_fast_paths.py",
            "tests/server/test_rollout_validation_messages.py",
            "tests/server/test_rollout_hostile.py",
            "tests/server/test_rollout_step_id_echo.py",
            "tests/server/test_rollout_batch_columns.py",
            "tests/server/test_rollout_batch_item_validation.py",
            "tests/server/test_batch_peek.py",
            "tests/client/test_rollout_typed_server_errors.py",
            "tests/server/test_rollout_routes_review.py",  # a server per test: the closures' slips
        ),
        fork_server=True,  # test_rollout_fast_paths.py imports torch
    ),
    "remote_engine": CoreModule(
        ("src/rollserve/client/remote_engine.py",),
        (
            "tests/client/test_inference_engine.py",
            "tests/client/test_engine_reset_retry.py",
            "tests/client/test_engine_restart.py",
            "tests/client/test_remote_engine_failures.py",
            "tests/client/test_remote_engine_jpeg_requirement.py",
            "tests/client/test_engine_backoff_and_frame_limit.py",
            "tests/client/test_policy_client_send_timeout.py",
            "tests/client/test_remote_engine_review.py",
        ),
        fork_server=True,  # the servers these tests start load a torch policy
    ),
    "local_engine": CoreModule(
        ("src/rollserve/client/local_engine.py",),
        (
            "tests/client/test_inference_engine.py",
            "tests/client/test_inference_engine_health_and_horizon.py",
            "tests/client/test_inference_loop_review.py",
            "tests/test_golden_parity.py",
            "tests/client/test_local_engine_review.py",
        ),
        fork_server=True,  # the in-process policy is a torch module
    ),
    "metrics": CoreModule(("src/rollserve/server/metrics.py",), ("tests/server/test_metrics.py",)),
    "running": CoreModule(
        ("src/rollserve/server/running.py",),
        (
            "tests/server/test_running.py",
            "tests/server/test_event_loop.py",
            "tests/server/test_launch_review.py",
            "tests/test_cli_validation.py",
            "tests/server/test_running_review.py",
        ),
        fork_server=True,  # the served apps load torch models
    ),
    # `rollserve serve`'s flags and what they build. The subprocess tests of test_policy_launch.py
    # cannot be traced, its in-process ones (a bad spec, --policy-arg) are; test_world_action.py left
    # after the first run: its in-process checks are in the review file, and its one `main` call
    # started a 4 s subprocess for each mutant of `main`
    "launch": CoreModule(
        ("src/rollserve/server/launch.py",),
        (
            "tests/server/test_launch_review.py",
            "tests/test_cli_validation.py",
            "tests/server/test_serve_trained_world.py",
            "tests/server/test_policy_launch.py",
            "tests/adapters/test_lerobot_loading.py",
            "tests/scale/test_ray_proxy_flags.py",
            "tests/server/test_launch_module_review.py",  # main in-process, a server per test
        ),
        fork_server=True,  # the served worlds and policies load torch
    ),
    "log_guard": CoreModule(
        ("src/rollserve/server/log_guard.py",),
        ("tests/server/test_connection_guards.py", "tests/server/test_log_guard.py"),
    ),
    "guidance": CoreModule(
        ("src/rollserve/models/flow_sampling.py",),
        ("tests/models/test_flow_guidance.py", "tests/models/test_guidance_settings.py"),
        fork_server=True,
    ),
    # The unit tests map observations by hand; the socket tests drive the real openpi client (and
    # raw openpi frames) against a served ChunkPolicy (numpy only: no torch, no fork server).
    "openpi_layouts": CoreModule(
        ("src/rollserve/server/policy/openpi_layouts.py",),
        (
            "tests/server/test_policy_layouts.py",
            "tests/server/test_openpi_image_rules.py",
            "tests/server/test_policy_openpi.py",
            "tests/server/test_empty_images_over_socket.py",
            "tests/server/test_openpi_layouts_review.py",
        ),
    ),
    # World-action models and the simulator world; test_rollout_frames.py is the only test of the
    # sim world's frames over HTTP (the acting tests render too, but compare actions, not pixels).
    "worlds_acting": CoreModule(
        ("src/rollserve/models/world_action.py", "src/rollserve/models/sim_world.py"),
        (
            "tests/models/test_sim_world.py",
            "tests/models/test_world_action_state.py",
            "tests/server/test_world_action.py",
            "tests/server/test_world_action_batching.py",
            "tests/server/test_world_action_inputs.py",
            "tests/server/test_rollout_frames.py",
            "tests/models/test_worlds_acting_review.py",
        ),
        fork_server=True,  # the reference policy, the learned and video worlds are torch
    ),
    # The checkpoint files users load: the shipped flow policy's (`serve`, the demo), the worlds'
    # nets' and the normalisation statistics. test_flow_weights.py calls none of them: left out.
    "checkpoints": CoreModule(
        (
            "src/rollserve/models/checkpoint.py",
            "src/rollserve/models/net_checkpoint.py",
            "src/rollserve/models/flow_stats.py",
        ),
        (
            "tests/models/test_flow_checkpoint.py",
            "tests/models/test_flow_policy.py",
            "tests/models/test_world_checkpoint_checks.py",
            "tests/models/test_flow_guidance.py",
            "tests/models/test_guidance_settings.py",
            "tests/training/test_policy_training.py",
            "tests/training/test_world_training_review.py",
            "tests/models/test_checkpoints_review.py",
        ),
        fork_server=True,  # the policies and worlds loaded are torch
    ),
    # How `serve --policy SPEC` and `--world NAME|module.path:factory` load what they serve (and the
    # toy world, which lives in worlds.py). test_policy_launch.py's subprocess tests are not traced.
    "loading": CoreModule(
        ("src/rollserve/models/loading.py", "src/rollserve/models/worlds.py"),
        (
            "tests/server/test_policy_loading.py",
            "tests/models/test_world_protocol.py",
            "tests/server/test_serve_trained_world.py",
            "tests/adapters/test_lerobot_loading.py",
            "tests/server/test_policy_launch.py",
            "tests/test_cli_validation.py",
            "tests/server/test_launch_review.py",
            "tests/server/test_launch_module_review.py",
            "tests/server/test_rollout_start_state_exact.py",
            "tests/models/test_loading_review.py",
        ),
        fork_server=True,  # the learned and video worlds and the served policies load torch
    ),
    # The policies rollserve ships: the policy protocol, the flow-matching reference policy and
    # its net, the simple numpy policies, and the errors a policy raises.
    "policies": CoreModule(
        (
            "src/rollserve/models/policy.py",
            "src/rollserve/models/flow_policy.py",
            "src/rollserve/models/flow_net.py",
            "src/rollserve/models/simple_policies.py",
            "src/rollserve/engine/policy_errors.py",
        ),
        (
            "tests/models/test_flow_policy.py",
            "tests/models/test_flow_guidance.py",
            "tests/models/test_flow_checkpoint.py",
            "tests/models/test_guidance_settings.py",
            "tests/models/test_checkpoints_review.py",
            "tests/server/test_policy_loading.py",
            "tests/test_golden_parity.py",
            "tests/models/test_policies_review.py",
        ),
        fork_server=True,  # the flow policy is torch
    ),
    # The MuJoCo task: the scene, the task's rules, the gymnasium env, the expert, the snapshots.
    "sim": CoreModule(
        (
            "src/rollserve/sim/env.py",
            "src/rollserve/sim/task.py",
            "src/rollserve/sim/scene.py",
            "src/rollserve/sim/expert.py",
            "src/rollserve/sim/kinematics.py",
            "src/rollserve/sim/layout.py",
            "src/rollserve/sim/snapshot.py",
            "src/rollserve/sim/rendering.py",
        ),
        (
            "tests/sim/test_sim_env.py",
            "tests/sim/test_sim_expert.py",
            "tests/sim/test_sim_snapshot.py",
            "tests/models/test_sim_world.py",
            "tests/sim/test_sim_review.py",
        ),
        # no fork server: no torch here, and a forked child renders through the parent's EGL
        # (Mesa llvmpipe, LP_NUM_THREADS=0) as well as the parent does
    ),
    # What the demo measures and how it paces the robots (the numbers README's results come from).
    "demo": CoreModule(
        (
            "src/rollserve/demo/metrics.py",
            "src/rollserve/demo/simtime.py",
            "src/rollserve/demo/strategies.py",
            "src/rollserve/demo/netdelay.py",
        ),
        (
            "tests/demo/test_demo_metrics.py",
            "tests/demo/test_demo_strategies.py",
            "tests/demo/test_demo_netdelay.py",
            "tests/demo/test_demo_review.py",
        ),
    ),
    # `rollserve` itself: the dispatcher and the argparse types every subcommand shares
    # (server/settings.py is left out: a dataclass without functions, mutmut makes no mutants of it).
    "cli": CoreModule(
        ("src/rollserve/cli.py", "src/rollserve/training/cli.py"),  # the top level and `train`'s router
        (
            "tests/test_cli_validation.py",
            "tests/training/test_policy_cli_flags.py",
            "tests/test_cli_review.py",
        ),
        fork_server=True,  # test_cli_validation.py trains a world and builds a video world's net (torch)
    ),
    # `rollserve train world [--video]`: the learned and video world models' training (policy.py and
    # policy_eval.py are `training_policy`, training/cli.py is in `cli`). Every test here is in
    # process with tiny configs.
    "training": CoreModule(
        ("src/rollserve/training/world_model.py", "src/rollserve/training/video_world_model.py"),
        (
            "tests/training/test_world_training_review.py",
            "tests/training/test_video_episodes_cache.py",
            "tests/models/test_learned_world.py",
            "tests/test_cli_validation.py",
            "tests/training/test_training_review.py",
        ),
        fork_server=True,  # torch
    ),
    # `/openapi.json` and `/docs`: the rollout routes' declared operations (never mounted).
    "rollout_openapi": CoreModule(
        ("src/rollserve/server/rollout/openapi.py",),
        (
            "tests/server/test_rollout_openapi.py",
            "tests/server/test_app_review.py",
            "tests/server/test_rollout_openapi_review.py",
        ),
    ),
    # `rollserve dataset` (recording, the .npz format, loading) and the evaluation loop; no torch.
    "sim_data": CoreModule(
        ("src/rollserve/sim/dataset.py", "src/rollserve/sim/evaluate.py"),
        (
            "tests/sim/test_sim_dataset.py",
            "tests/sim/test_dataset_arguments.py",
            "tests/sim/test_sim_expert.py",
            "tests/sim/test_sim_data_review.py",
        ),
        # its 96x96 images test takes 4 s per mutant; the review file records small images instead
        ("-k", "not test_images_are_recorded_per_frame"),
    ),
    # `rollserve train policy` and `rollserve eval policy`: the flow policy's training and evaluation.
    "training_policy": CoreModule(
        ("src/rollserve/training/policy.py", "src/rollserve/training/policy_eval.py"),
        (
            "tests/training/test_policy_training.py",
            "tests/training/test_policy_eval.py",
            "tests/training/test_policy_cli_record.py",
            "tests/training/test_training_policy_review.py",
        ),
        fork_server=True,  # torch
    ),
    # `rollserve demo`'s runner: the episodes, the servers it starts and the strategies' loops.
    # test_demo_end_to_end.py is left out: it runs the demo in a subprocess (15 s, never traced); the
    # review file runs the same path in process with a numpy policy. The interrupt file's own
    # in-process demo serves the torch checkpoint (its case is in the review file, without torch).
    "demo_runner": CoreModule(
        ("src/rollserve/demo/runner.py",),
        (
            "tests/demo/test_demo_runner_review.py",
            "tests/demo/test_demo_interrupt.py",
            "tests/demo/test_demo_output_lines.py",
            "tests/demo/test_demo_review.py",
        ),
        ("-k", "not test_ctrl_c_while_writing_the_plot_keeps_the_measurements"),
    ),
    # What `rollserve demo` leaves behind: the table and JSON line, the live progress, the per-request
    # recording, the real-time robot loop, the plot and the video (runner.py is `demo_runner`). All
    # in process, no torch (the runner's review stubs it): no fork server. test_demo_interrupt.py's
    # torch case is left out as in `demo_runner`; test_demo_end_to_end.py runs a subprocess.
    "demo_output": CoreModule(
        (
            "src/rollserve/demo/report.py",
            "src/rollserve/demo/recording.py",
            "src/rollserve/demo/progress.py",
            "src/rollserve/demo/video.py",
            "src/rollserve/demo/robot.py",
            "src/rollserve/demo/plots.py",
        ),
        (
            "tests/demo/test_demo_metrics.py",
            "tests/demo/test_demo_review.py",
            "tests/demo/test_demo_runner_review.py",
            "tests/demo/test_demo_interrupt.py",
            "tests/demo/test_demo_output_lines.py",
            "tests/demo/test_demo_output_review.py",
        ),
        ("-k", "not test_ctrl_c_while_writing_the_plot_keeps_the_measurements"),
    ),
    # `--policy lerobot:PATH`: the LeRobot adapter. Needs the LeRobot venv (its tests skip without
    # LeRobot): `.venv-lerobot/bin/python tools/mutation.py --module lerobot_adapter`. The three
    # `test_rollserve_serve_drives_engine_and_openpi_client` cases are left out: each serves from a
    # subprocess (10 s, never traced); the in-process parity tests drive the same adapter.
    "lerobot_adapter": CoreModule(
        ("src/rollserve/adapters/lerobot/*.py",),
        (
            "tests/adapters/test_lerobot_loading.py",
            "tests/adapters/test_lerobot_serving.py",
            "tests/adapters/test_lerobot_adapter_review.py",
        ),
        ("-k", "not test_rollserve_serve_drives_engine_and_openpi_client"),
        fork_server=True,  # torch
    ),
}

STATUS_LINE = re.compile(r"^\s+(\S+): (.+)$")


def _toml_list(values: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def prepare(name: str, module: CoreModule) -> Path:
    """A fresh scratch copy of src/, tests/ and pyproject.toml configured for this module."""
    workdir = SCRATCH / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src", workdir / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", workdir / "tests", ignore=ignore)
    _copy_read_only_trees(workdir)
    _configure(workdir, module)
    return workdir


def _copy_read_only_trees(workdir: Path) -> None:
    for tree in READ_BY_TESTS:
        shutil.rmtree(workdir / tree, ignore_errors=True)
        shutil.copytree(ROOT / tree, workdir / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _configure(workdir: Path, module: CoreModule) -> None:
    """The scratch copy's pyproject.toml: the project's, plus mutmut's settings for this module
    (written again by ``recheck``, so a test file added to the module since is used)."""
    config = (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {_toml_list(module.sources)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(module.tests)}\n"
        f"pytest_add_cli_args = {_toml_list(('-p', 'no:cacheprovider', '-q', *module.pytest_args))}\n"
        f"also_copy = {_toml_list(READ_BY_TESTS)}\n"
        "use_git_change_detection = false\n"
        + ('process_isolation = "forkserver"\n' if module.fork_server else "")
    )
    (workdir / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + config)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # mutmut puts the mutated copy first on sys.path; nothing may shadow it
    return env


def run(name: str, workdir: Path, *, children: int, timeout_s: float) -> int:
    """Run mutmut in the scratch copy; returns its exit status (124 when the time bound hit)."""
    log = workdir / "mutmut.log"
    print(f"[{name}] mutating {', '.join(MODULES[name].sources)} (log: {log})", flush=True)
    return _mutmut_run(workdir, [], log, children=children, timeout_s=timeout_s)


def _mutmut_run(workdir: Path, names: list[str], log: Path, *, children: int, timeout_s: float) -> int:
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names]
    with log.open("w") as out:
        try:
            return subprocess.run(
                command, cwd=workdir, env=_env(), stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def recheck(name: str, workdir: Path, *, children: int, timeout_s: float) -> int:
    """Finish the last run of ``name`` against today's code and tests, without redoing its kills.

    The scratch copy gets today's ``src/`` and ``tests/``. mutmut keeps the results of functions
    whose code is unchanged (by hash) and forgets those of changed ones, so a first pass checks
    every mutant without a result (changed functions, or left by a time bound), and a second pass
    reruns what survived, except the mutants listed as equivalent. A mutant a test killed stays
    killed (tests are only ever added), so the table is that of a full rerun at a fraction of its cost.
    """
    if not (workdir / "mutants").exists():
        raise SystemExit(f"[{name}] no earlier run to recheck: run it in full")
    deadline = time.monotonic() + timeout_s
    mutated = {p.relative_to(ROOT) for pattern in MODULES[name].sources for p in ROOT.glob(pattern)}
    for path in (ROOT / "src").rglob("*.py"):
        relative = path.relative_to(ROOT)
        copy = workdir / relative
        if copy.exists() and copy.read_bytes() == path.read_bytes():
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)  # a fresh mtime: mutmut regenerates the mutants of a mutated file
        if relative not in mutated:
            (workdir / "mutants" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, workdir / "mutants" / relative)
    shutil.rmtree(workdir / "tests")
    shutil.copytree(ROOT / "tests", workdir / "tests", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _copy_read_only_trees(workdir)
    _configure(workdir, MODULES[name])
    print(f"[{name}] pass 1: mutants without a result", flush=True)
    log = workdir / "mutmut-recheck-1.log"
    status = _mutmut_run(workdir, [], log, children=children, timeout_s=deadline - time.monotonic())
    if status == 124:
        return status
    listed = equivalent_mutants()  # reviewed survivors: rerunning them only costs time
    skip = DETECTED | UNCHECKED
    again = sorted(k for k, v in results(workdir).items() if v not in skip and k not in listed)
    print(f"[{name}] pass 2: rechecking {len(again)} mutants no test detected", flush=True)
    if not again:
        return status
    log = workdir / "mutmut-recheck-2.log"
    return _mutmut_run(workdir, again, log, children=children, timeout_s=deadline - time.monotonic())


def results(workdir: Path) -> dict[str, str]:
    """Mutant name -> status ("killed", "survived", "timeout", "no tests", ...)."""
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=workdir,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        match = STATUS_LINE.match(line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def equivalent_mutants() -> set[str]:
    """Mutants docs/testing.md lists as equivalent (a line starting with ``- `name` ``)."""
    if not DOCS.exists():
        return set()
    return set(re.findall(r"^- `([\w.]+__mutmut_\d+)`", DOCS.read_text(), flags=re.MULTILINE))


DETECTED = {"killed", "timeout", "caught by type check", "segfault"}
UNCHECKED = {"not checked", "check was interrupted by user"}


def stale_listings(name: str, statuses: dict[str, str], equivalent: set[str]) -> list[tuple[str, str]]:
    """Listed equivalents of ``name`` that cannot be right: a test killed them, or no such mutant
    exists. mutmut numbers a function's mutants anew when the function changes, so after an edit a
    listed name may point at another mutant; its listing would then hide that one from the score."""
    listed = sorted(k for k in equivalent if _mutated_file(k, MODULES[name].sources))
    # a time-out is not evidence: on a loaded machine an equivalent mutant can run past its bound
    return [(k, "killed by a test") for k in listed if statuses.get(k) == "killed"] + [
        (k, "no such mutant") for k in listed if k not in statuses
    ]


def _mutated_file(mutant: str, sources: tuple[str, ...]) -> bool:
    """Whether ``mutant`` (``pkg.module.x_func__mutmut_N`` or ``pkg.module.xǁClassǁmethod__mutmut_N``)
    is of a file the ``sources`` patterns name."""
    module = re.split(r"\.x(?:_|ǁ)", mutant, maxsplit=1)[0]
    path = "src/" + module.replace(".", "/") + ".py"
    return any(fnmatch.fnmatch(path, pattern) for pattern in sources)


def score_row(name: str, statuses: dict[str, str], equivalent: set[str]) -> tuple[str, float]:
    """Killed over checked non-equivalent mutants; mutants the time bound left unchecked are shown."""
    counted = {k: v for k, v in statuses.items() if k not in equivalent and v not in UNCHECKED}
    unchecked = sum(v in UNCHECKED for v in statuses.values())
    killed = sum(v in DETECTED for v in counted.values())
    survived = len(counted) - killed
    score = 100.0 * killed / len(counted) if counted else float("nan")
    listed = sum(k in equivalent for k in statuses)
    row = f"| {name} | {len(statuses)} | {unchecked} | {listed} | {killed} | {survived} | {score:.1f} % |"
    return row, score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(MODULES), help="default: all")
    parser.add_argument("--children", type=int, default=2, help="parallel mutant runs (default 2)")
    parser.add_argument("--timeout-min", type=float, default=40.0, help="time bound per module")
    parser.add_argument("--survivors", action="store_true", help="show the diff of each survivor")
    parser.add_argument("--reuse", action="store_true", help="report an earlier run, do not rerun")
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="finish the last run with today's code and tests, rerunning only what it did not detect",
    )
    args = parser.parse_args(argv)
    names = args.module or list(MODULES)
    equivalent = equivalent_mutants()
    rows = []
    for name in names:
        workdir = SCRATCH / name
        if args.recheck:
            started = time.monotonic()
            status = recheck(name, workdir, children=args.children, timeout_s=args.timeout_min * 60)
            print(f"[{name}] mutmut exit {status} after {time.monotonic() - started:.0f} s", flush=True)
        elif not args.reuse:
            started = time.monotonic()
            workdir = prepare(name, MODULES[name])
            status = run(name, workdir, children=args.children, timeout_s=args.timeout_min * 60)
            print(f"[{name}] mutmut exit {status} after {time.monotonic() - started:.0f} s", flush=True)
        statuses = results(workdir)
        row, _ = score_row(name, statuses, equivalent)
        rows.append(row)
        survivors = sorted(
            k for k, v in statuses.items() if v not in DETECTED | UNCHECKED and k not in equivalent
        )
        for mutant in survivors:
            print(f"[{name}] {statuses[mutant]}: {mutant}")
            if args.survivors:
                diff = subprocess.run(
                    [sys.executable, "-m", "mutmut", "show", mutant],
                    cwd=workdir,
                    env=_env(),
                    capture_output=True,
                    text=True,
                ).stdout
                print(diff)
        for mutant, why in stale_listings(name, statuses, equivalent):
            print(f"[{name}] stale equivalent listing ({why}): {mutant}")
    print("\n| module | mutants | not checked (time bound) | listed equivalent | killed | survived | score |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
