"""What an unchanged openpi client relies on from the layouts (``server/policy/openpi_layouts.py``),
pinned after its first mutation run: the observation each of openpi's own example layouts maps to
(openpi's ``make_droid_example``, ``make_libero_example`` and ``make_aloha_example`` keys), the
``openpi_input`` metadata, the prompt rules (``task`` when there is no ``prompt``, bytes decoded as
UTF-8, 4096 characters), the exact refusal texts, and that a 3-row HWC image is not read as CHW.
Expected values are written out by hand; the socket tests use the real server and openpi client."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.sync.client import connect

from rollserve.models.simple_policies import ChunkPolicy, droid_policy, echo_policy
from rollserve.server.app import create_app
from rollserve.server.policy.openpi_layouts import LayoutError, describe_layout, detect_layout, to_observation
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

# openpi-client 0.1.2 itself calls websockets' connect() the pre-17 way.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")

DROID_META = {
    "layout": "droid",
    "state_keys": ["observation/joint_position", "observation/gripper_position"],
    "image_keys": ["observation/exterior_image_1_left", "observation/wrist_image_left"],
    "prompt_key": "prompt",
}
LIBERO_META = {
    "layout": "libero",
    "state_keys": ["observation/state"],
    "image_keys": ["observation/image", "observation/wrist_image"],
    "prompt_key": "prompt",
}
ALOHA_META = {
    "layout": "aloha",
    "state_keys": ["state"],
    "image_keys": ["images/<camera>"],
    "prompt_key": "prompt",
}
AUTO_META = {"layout": "auto", "detects": ["droid", "aloha", "libero"]}


def _pixels(value: int, shape: tuple[int, ...] = (4, 6, 3)) -> np.ndarray:
    return np.full(shape, value, np.uint8)


def _sha(image: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


# -- openpi's own example observations ---------------------------------------------------------------


def test_openpi_droid_example_maps_to_an_8_value_float32_state_and_its_two_cameras() -> None:
    exterior, wrist = _pixels(1), _pixels(2)
    obs = {
        "observation/exterior_image_1_left": exterior,
        "observation/wrist_image_left": wrist,
        "observation/joint_position": np.array([0.5, -0.25, 1.0, 2.0, -3.0, 0.125, 4.0]),  # float64
        "observation/gripper_position": np.array([0.75]),
        "prompt": "do something",
    }
    out, layout = to_observation(obs)
    assert layout == "droid"
    assert out["state"].dtype == np.float32 and out["state"].shape == (8,)
    assert out["state"].tolist() == [0.5, -0.25, 1.0, 2.0, -3.0, 0.125, 4.0, 0.75]
    assert list(out["images"]) == ["exterior_image_1_left", "wrist_image_left"]
    assert out["images"]["exterior_image_1_left"].max() == 1 and out["images"]["wrist_image_left"].max() == 2
    assert out["task"] == "do something"


def test_openpi_libero_example_maps_its_state_cameras_and_prompt() -> None:
    obs = {
        "observation/state": np.array([1, 2, 3, 4, 5, 6, 7, 8], np.int64),  # any numeric dtype
        "observation/image": _pixels(3),
        "observation/wrist_image": _pixels(4),
        "prompt": "open the drawer",
    }
    out, layout = to_observation(obs, "auto", ("image", "wrist_image"))
    assert layout == "libero"
    assert out["state"].dtype == np.float32 and out["state"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert list(out["images"]) == ["image", "wrist_image"]
    assert out["images"]["image"].max() == 3 and out["images"]["wrist_image"].max() == 4
    assert out["task"] == "open the drawer"


def test_openpi_aloha_example_chw_cameras_become_hwc() -> None:
    chw = np.arange(3 * 2 * 4, dtype=np.uint8).reshape(3, 2, 4)  # chw[c, y, x] = 8c + 4y + x
    cams = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
    obs = {"state": np.ones(14), "images": {cam: chw for cam in cams}, "prompt": "fold"}
    out, layout = to_observation(obs)
    assert layout == "aloha" and out["state"].dtype == np.float32 and out["state"].tolist() == [1.0] * 14
    assert list(out["images"]) == list(cams)
    image = out["images"]["cam_high"]
    assert image.shape == (2, 4, 3) and image.flags["C_CONTIGUOUS"]
    assert image[0, 0].tolist() == [0, 8, 16] and image[1, 3].tolist() == [7, 15, 23]


@pytest.mark.parametrize(("shape", "last_pixel"), [((3, 5, 3), [42, 43, 44]), ((3, 3, 3), [24, 25, 26])])
def test_an_hwc_image_three_rows_high_is_kept_as_it_is(
    shape: tuple[int, int, int], last_pixel: list[int]
) -> None:
    """Only an image whose last axis is not 3 and whose first is 3 is read as CHW."""
    hwc = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)  # hwc[y, x, c] = 3 (W y + x) + c
    out, _ = to_observation({"state": np.zeros(2), "images": {"cam": hwc}}, "aloha")
    image = out["images"]["cam"]
    assert image.shape == shape
    assert image[0, 1].tolist() == [3, 4, 5] and image[2, -1].tolist() == last_pixel


def test_a_state_beyond_float32_becomes_inf_without_a_warning() -> None:
    """inf is refused later as ``bad_field``; the cast itself warns nothing (no log noise per request)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = to_observation({"state": np.array([1e300, -1e300, 0.5])}, "aloha")
    assert out["state"].dtype == np.float32 and out["state"].tolist() == [np.inf, -np.inf, 0.5]


# -- the prompt ---------------------------------------------------------------------------------------


def test_task_is_read_when_there_is_no_prompt_and_prompt_wins() -> None:
    state = np.zeros(2)
    assert to_observation({"state": state, "task": "stack"}, "aloha")[0]["task"] == "stack"
    assert to_observation({"state": state, "task": "stack", "prompt": "pick"}, "aloha")[0]["task"] == "pick"
    assert to_observation({"state": state}, "aloha")[0]["task"] == ""


@pytest.mark.parametrize(
    ("prompt", "task"),
    [(b"pick the cube", "pick the cube"), (b"caf\xc3\xa9", "caf\u00e9"), (b"\xffok", "\ufffdok")],
    ids=["ascii", "utf-8", "invalid"],
)
def test_a_bytes_prompt_is_decoded_as_utf8_replacing_what_is_not(prompt: bytes, task: str) -> None:
    assert to_observation({"state": np.zeros(2), "prompt": prompt}, "aloha")[0]["task"] == task


def test_a_prompt_of_4096_characters_is_accepted_and_one_more_is_refused() -> None:
    state = np.zeros(2)
    longest = "\u00e9" * 4096  # characters, not bytes: 8192 bytes in UTF-8
    assert to_observation({"state": state, "prompt": longest}, "aloha")[0]["task"] == longest
    assert to_observation({"state": state, "prompt": longest.encode()}, "aloha")[0]["task"] == longest
    with pytest.raises(LayoutError) as info:
        to_observation({"state": state, "prompt": longest + "x"}, "aloha")
    assert str(info.value) == "prompt is longer than 4096 characters"


# -- refusal texts (a client sees each after "bad_observation: ") ---------------------------------------


@pytest.mark.parametrize(
    ("obs", "layout", "message"),
    [
        ([1, 2], "auto", "an observation must be a map, got list"),
        ({"state": np.zeros(2), "prompt": 3}, "aloha", "prompt must be a string, got int"),
        ({"state": np.zeros(2)}, "nope",
         "unknown layout 'nope'; choose one of ('auto', 'droid', 'aloha', 'libero')"),
        ({"state": np.zeros(8)}, "droid", "missing state key 'observation/joint_position'"),
        ({"observation/state": np.array(["a"])}, "libero",
         "'observation/state' must be numeric, got dtype <U1"),
        (
            {"state": np.zeros(2), "images": {"c": np.zeros((4, 4, 3), np.float32)}},
            "aloha",
            "image 'images/c' must be uint8 HxWx3 (or 3xHxW), got float32 (4, 4, 3)",
        ),
        (
            {"state": np.zeros(2), "images": {"c": np.zeros((4, 4, 2), np.uint8)}},
            "aloha",
            "image 'images/c' must have 3 channels, got shape (4, 4, 2)",
        ),
        ({"foo": 1, "bar": 2}, "auto", "cannot tell the observation layout from keys ['bar', 'foo']; "
         "start the server with --openpi-layout"),
    ],
)  # fmt: skip
def test_each_refusal_reads_exactly(obs: Any, layout: str, message: str) -> None:
    with pytest.raises(LayoutError) as info:
        to_observation(obs, layout)
    assert str(info.value) == message


def test_an_undetectable_layout_names_its_first_12_keys_in_order_as_strings() -> None:
    obs: dict[Any, int] = {f"k{i:02d}": i for i in range(12)}
    obs.update({"zeta": 0, 3: 0})  # 14 keys; an int key (msgpack maps may have them) named as a string
    with pytest.raises(LayoutError) as info:
        detect_layout(obs)
    named = ["3"] + [f"k{i:02d}" for i in range(11)]  # "k11" and "zeta" are cut
    assert str(info.value) == (
        f"cannot tell the observation layout from keys {named}; start the server with --openpi-layout"
    )


def test_describe_layout_for_each_layout() -> None:
    assert describe_layout("auto") == AUTO_META
    assert describe_layout("droid") == DROID_META
    assert describe_layout("libero") == LIBERO_META
    assert describe_layout("aloha") == ALOHA_META


# -- camera naming ------------------------------------------------------------------------------------


def test_images_beyond_the_policys_cameras_are_left_out() -> None:
    """More images than cameras without one of their name: each such camera takes the next image in
    the layout's order, and what is left over does not reach the policy."""
    low, high, wrist = _pixels(5), _pixels(6), _pixels(7)
    aloha = {"state": np.zeros(2), "images": {"cam_low": low, "cam_high": high, "cam_wrist": wrist}}
    images = to_observation(aloha, "aloha", ("front",))[0]["images"]
    assert list(images) == ["front"] and images["front"].max() == 5
    libero = {"observation/state": np.zeros(8), "observation/image": high, "observation/wrist_image": wrist}
    images = to_observation(libero, "libero", ("agentview",))[0]["images"]
    assert list(images) == ["agentview"] and images["agentview"].max() == 6


# -- over the real openpi endpoint ------------------------------------------------------------------


def _server(policy: Any, layout: str = "auto") -> Any:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    return serving(create_app(settings, policy=PolicyService(policy, settings, openpi_layout=layout)))


@pytest.fixture
def droid_server() -> Iterator[tuple[ChunkPolicy, RunningServer]]:
    policy = droid_policy(record_calls=True)
    with _server(policy) as running:
        yield policy, running


@pytest.mark.parametrize(
    ("layout", "meta"),
    [("auto", AUTO_META), ("droid", DROID_META), ("libero", LIBERO_META), ("aloha", ALOHA_META)],
)
def test_the_openpi_client_reads_which_keys_the_server_reads(layout: str, meta: dict[str, Any]) -> None:
    with _server(droid_policy(), layout) as running:
        assert WebsocketClientPolicy(running.host, running.port).get_server_metadata()["openpi_input"] == meta


def test_droid_and_libero_states_reach_the_policy_as_sent_in_float32() -> None:
    """An echo policy's actions are the state it got: DROID's joints then gripper, LIBERO's state."""
    joints = np.array([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7])  # float64, as DROID robots send it
    droid = {
        "observation/exterior_image_1_left": _pixels(1),
        "observation/wrist_image_left": _pixels(2),
        "observation/joint_position": joints,
        "observation/gripper_position": np.array([0.9]),
        "prompt": "pick",
    }
    with _server(echo_policy("droid")) as running:
        actions = WebsocketClientPolicy(running.host, running.port).infer(droid)["actions"]
    expected = np.array([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, 0.9], np.float32)
    assert actions.dtype == np.float32 and actions.shape == (10, 8)
    assert all(row.tobytes() == expected.tobytes() for row in actions)
    libero = {
        "observation/state": np.array([1, 2, 3, 4, 5, 6, 7, 8], np.int32),
        "observation/image": _pixels(3),
        "observation/wrist_image": _pixels(4),
        "prompt": "open",
    }
    with _server(echo_policy("libero")) as running:
        actions = WebsocketClientPolicy(running.host, running.port).infer(libero)["actions"]
    assert actions.shape == (10, 7) and actions[0].tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_a_bytes_prompt_and_the_images_reach_the_policy(
    droid_server: tuple[ChunkPolicy, RunningServer],
) -> None:
    policy, running = droid_server
    exterior, wrist = _pixels(11, (5, 7, 3)), _pixels(12, (5, 7, 3))
    obs = {
        "observation/exterior_image_1_left": exterior,
        "observation/wrist_image_left": wrist,
        "observation/joint_position": np.zeros(7),
        "observation/gripper_position": np.zeros(1),
        "prompt": b"caf\xc3\xa9 \xff",
    }
    WebsocketClientPolicy(running.host, running.port).infer(obs)
    call = policy.calls[-1]
    assert call["task"] == "caf\u00e9 \ufffd"
    assert call["images"] == {"exterior_image_1_left": _sha(exterior), "wrist_image_left": _sha(wrist)}


def test_the_endpoint_refuses_with_the_exact_texts(droid_server: tuple[ChunkPolicy, RunningServer]) -> None:
    policy, running = droid_server
    good = {
        "observation/joint_position": np.zeros(7),
        "observation/gripper_position": np.zeros(1),
        "observation/exterior_image_1_left": _pixels(1),
        "observation/wrist_image_left": _pixels(2),
    }
    frames = [
        ([1, 2], "bad_observation: an observation must be a map, got list"),
        ({"foo": 1}, "bad_observation: cannot tell the observation layout from keys ['foo']; "
         "start the server with --openpi-layout"),
        ({**good, "prompt": 3}, "bad_observation: prompt must be a string, got int"),
        ({**good, "prompt": "x" * 4097}, "bad_observation: prompt is longer than 4096 characters"),
        ({**good, "observation/gripper_position": np.array([1e300])},
         "bad_field: state holds NaN or inf values"),
    ]  # fmt: skip
    calls = len(policy.calls)
    with connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata
        replies = []
        for obs, _ in frames:
            ws.send(msgpack_numpy.packb(obs))
            replies.append(ws.recv(timeout=10))
        ws.send(msgpack_numpy.packb({**good, "prompt": "y" * 4096}))
        assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (10, 8)
    assert replies == [message for _, message in frames]
    assert [call["task"] for call in policy.calls[calls:]] == ["y" * 4096]
