"""Qwen3-VL's own picture preprocessing (vlm/qwen3_vl.py, its published settings): the driver's
prompts for the reference's tasks carry exactly the picture tokens the real processor makes, token for
token against the processor's own chat rendering. The tokenizer and chat template are the project's
(the same Qwen-VL markup; Qwen's own files are not available here)."""
import numpy as np
import pytest

from envs.registry import get_environment
from rl.inputs import task_prompter
from vlm import qwen3_vl
from vlm.chat import CHAT_TEMPLATE
from vlm.processor import ImageOnlyQwen3VLProcessor, load_processor


@pytest.fixture(scope="module")
def processor(tiny_model_dir):
    tokenizer = load_processor(tiny_model_dir).tokenizer
    return ImageOnlyQwen3VLProcessor(image_processor=qwen3_vl.image_processor(), tokenizer=tokenizer,
                                     chat_template=CHAT_TEMPLATE)


@pytest.mark.parametrize("env_class, cells", [("maze_2d/easy", 81), ("maze_2d/hard", 121)])
def test_a_maze_picture_at_the_reference_size_is_one_token_a_cell(processor, env_class, cells):
    """cell_px 32 = a 16-pixel patch x a merge of 2: the reference config's one picture token a cell."""
    task = get_environment(env_class)
    height, width = task.picture_size(32)
    prompter = task_prompter(processor, task, 32)
    assert prompter.n_image == qwen3_vl.picture_tokens(height, width) == cells


def test_the_drivers_prompt_equals_the_processors_own_rendering_with_the_real_picture_tokens(processor):
    """Two turns of a maze episode (the first picture dropped by a picture window of 1): the driver's
    token pieces equal apply_chat_template + the processor's expansion of the picture it keeps."""
    task = get_environment("maze_2d/easy")
    env = task.make_env(32, 15)
    picture, _ = env.reset(seed=3)
    prompter = task_prompter(processor, task, 32)
    answer = processor.tokenizer.encode("<action>up</action>", add_special_tokens=False)
    ids, kept = prompter.prompt(["Turn 1.", "Moved up."], [answer], window=0, pictures=1)
    messages = [{"role": "system", "content": task.instruction},
                {"role": "user", "content": [{"type": "text", "text": "Turn 1."}]},
                {"role": "assistant", "content": "<action>up</action>"},
                {"role": "user", "content": [{"type": "text", "text": "Moved up."}, {"type": "image"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[picture], return_tensors="np")
    assert enc["input_ids"][0].tolist() == ids and kept == [1]
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert ids.count(image_pad) == int(np.prod(enc["image_grid_thw"][0])) // 4 == 81
    black_and_white = np.zeros((288, 288, 3), np.uint8)
    black_and_white[:, 144:] = 255
    values = processor.image_processor(images=[black_and_white], return_tensors="np")["pixel_values"]
    assert np.allclose(sorted(set(np.round(values.ravel(), 4))), [-1.0, 1.0])  # mean and std 0.5: [-1, 1]


def test_a_small_picture_is_enlarged_to_qwens_minimum():
    """Below 65,536 pixels Qwen3-VL enlarges a picture: a 5 x 5 maze at 32 pixels a cell (160 x 160)
    takes 64 tokens, not 25: one token a cell holds from 256 pixels a side."""
    assert qwen3_vl.picture_tokens(160, 160) == 64
    assert qwen3_vl.picture_tokens(256, 256) == 64
    assert qwen3_vl.picture_tokens(288, 288) == 81
