"""Feed-forward layers, Chain and VGG-11: PyTorch's layout and initialization, forwards against
NumPy loops written from the definitions, shapes for many geometries, and the errors that
``Chain.apply`` raises before anything is traced."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa.scan._core.layer_scan
from bppsa.models import Chain, Conv2d, Flatten, Linear, MaxPool2d, ReLU
from bppsa.models._vgg import vgg11


def numpy_conv(x, w, b, stride, padding):
    (sh, sw), (ph, pw) = stride, padding
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    _, _, kh, kw = w.shape
    oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
            y[:, :, i, j] = np.einsum("bchw,ochw->bo", patch, w) + b
    return y


def numpy_maxpool(x, kernel, stride):
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    y = np.zeros((*x.shape[:2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = x[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw].max(axis=(2, 3))
    return y


def numpy_params(layer, seed=0):
    """Standard-normal params of ``layer``'s shapes (NumPy: no JAX compilation per shape)."""
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape) for name, shape in layer.param_shapes().items()}


def numpy_input(shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape)


# Kernel, stride, padding, input (H, W): every combination of kernel 1/2/3/5, stride 1/2/3 and
# padding 0/1/2 on a non-square input, plus non-square kernels, strides and paddings.
GEOMETRIES = [(k, s, p, (6, 5)) for k in (1, 2, 3, 5) for s in (1, 2, 3) for p in (0, 1, 2)] + [
    ((3, 1), (1, 2), (0, 1), (4, 7)),
    ((2, 5), (3, 1), (2, 0), (5, 5)),
    ((1, 4), 2, (1, 2), (1, 4)),
    (4, (2, 3), 0, (4, 9)),
]


@pytest.mark.parametrize(("kernel", "stride", "padding", "hw"), GEOMETRIES)
def test_conv2d_matches_numpy_loop_and_output_shape(kernel, stride, padding, hw, x64):
    layer = Conv2d(2, 3, kernel, stride=stride, padding=padding)
    params, x = numpy_params(layer), numpy_input((2, 2, *hw))
    y = jax.jit(layer)(params, x)
    expected = numpy_conv(x, params["weight"], params["bias"], layer.stride, layer.padding)
    assert layer.output_shape((2, *hw)) == expected.shape[1:] == y.shape[1:]
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("kernel", "stride", "hw"),
    [
        (2, None, (6, 5)),
        (3, None, (7, 9)),
        (2, 1, (3, 4)),
        (3, 2, (7, 6)),
        ((1, 3), (2, 1), (5, 4)),
    ],
)
def test_maxpool2d_matches_numpy_loop_and_output_shape(kernel, stride, hw, x64):
    layer = MaxPool2d(kernel, stride)
    x = numpy_input((2, 3, *hw))
    y = jax.jit(layer)({}, x)
    expected = numpy_maxpool(x, layer.kernel_size, layer.stride)
    assert layer.output_shape((3, *hw)) == expected.shape[1:] == y.shape[1:]
    np.testing.assert_array_equal(y, expected)


def test_linear_relu_flatten_forwards(x64):
    linear = Linear(4, 3)
    params, x = numpy_params(linear), numpy_input((5, 4))
    expected = x @ params["weight"].T + params["bias"]
    np.testing.assert_allclose(linear(params, x), expected, rtol=1e-12)
    assert linear.output_shape((4,)) == (3,)
    np.testing.assert_array_equal(ReLU()({}, x), np.maximum(x, 0))
    images = np.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(Flatten()({}, images), images.reshape(2, 60))  # C order
    assert Flatten().output_shape((3, 4, 5)) == (60,)
    assert ReLU().output_shape((3, 4, 5)) == (3, 4, 5)


@pytest.mark.parametrize(
    ("layer", "fan_in"),
    [(Conv2d(3, 16, 3), 27), (Conv2d(2, 5, (1, 4)), 8), (Linear(7, 200), 7), (Linear(1, 300), 1)],
)
def test_init_shapes_and_pytorch_ranges(layer, fan_in):
    params = layer.init(jax.random.key(0))
    assert {k: v.shape for k, v in params.items()} == layer.param_shapes()
    bound = 1 / math.sqrt(fan_in)
    for value in params.values():
        assert value.dtype == jnp.float32
        assert np.all(np.abs(value) <= bound)
    # U(-bound, bound) fills its range: a bound half as wide would fail this.
    assert np.max(np.abs(params["weight"])) > 0.7 * bound
    again = layer.init(jax.random.key(0))
    assert all(np.array_equal(params[k], again[k]) for k in params)
    assert layer.init(jax.random.key(0), dtype=jnp.float16)["weight"].dtype == jnp.float16


def test_layers_without_params_and_normalized_attributes():
    for layer in (ReLU(), MaxPool2d(2), Flatten()):
        assert layer.init(jax.random.key(0)) == {} and layer.param_shapes() == {}
    conv = Conv2d(1, 2, 3, stride=(2, 1))
    assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (2, 1), (0, 0))
    assert MaxPool2d(3).stride == (3, 3) and MaxPool2d(3, 1).stride == (1, 1)
    assert hash(conv) == hash(Conv2d(1, 2, (3, 3), stride=(2, 1)))  # a valid static argument


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: Conv2d(0, 2, 3), ValueError),
        (lambda: Conv2d(1, 2, 0), ValueError),
        (lambda: Conv2d(1, 2, (3,)), TypeError),
        (lambda: Conv2d(1, 2, 3, stride=0), ValueError),
        (lambda: Conv2d(1, 2, 3, padding=-1), ValueError),
        (lambda: Conv2d(1, 2, 2.0), TypeError),
        (lambda: Linear(True, 2), TypeError),
        (lambda: MaxPool2d(2, 0), ValueError),
    ],
)
def test_constructors_validate(build, error):
    with pytest.raises(error):
        build()


@pytest.mark.parametrize(
    ("layer", "shape", "message"),
    [
        (Conv2d(2, 3, 5), (2, 4, 9), r"Conv2d\(.*\): the kernel height 5 is larger than .* 4"),
        (Conv2d(2, 3, 6, padding=1), (2, 9, 3), r"kernel width 6 .* padded width 3 \+ 2\*1 = 5"),
        (Conv2d(2, 3, 3), (3, 8, 8), r"in_channels=2 but its input has 3 channels"),
        (Conv2d(2, 3, 3), (2, 8), r"expected an input of shape \(C, H, W\), got \(2, 8\)"),
        (MaxPool2d(3), (2, 2, 5), r"MaxPool2d\(.*\): the kernel height 3 is larger"),
        (MaxPool2d(2), (4, 4), r"expected an input of shape \(C, H, W\)"),
        (Linear(8, 2), (6,), r"Linear\(.*\): in_features=8 but its input has 6 features"),
        (Linear(8, 2), (2, 4), r"expected an input of shape \(8,\), got \(2, 4\)"),
        (Flatten(), (), r"Flatten\(\): expected an input of at least one dim"),
    ],
)
def test_output_shape_errors_name_the_layer(layer, shape, message):
    with pytest.raises(ValueError, match=message):
        layer.output_shape(shape)


def small_chain():
    return Chain([Conv2d(2, 4, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(16, 3)])


def test_chain_init_forward_shapes_and_sequence_protocol():
    chain = small_chain()
    params = chain.init(jax.random.key(0))
    assert [set(p) for p in params] == [{"weight", "bias"}, set(), set(), set(), {"weight", "bias"}]
    assert not np.array_equal(params[0]["bias"][:3], params[4]["bias"])  # keys are split
    again = chain.init(jax.random.key(0))
    assert all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again))
    )
    assert chain.shapes((2, 4, 4)) == [(2, 4, 4), (4, 4, 4), (4, 4, 4), (4, 2, 2), (16,), (3,)]
    x = jax.random.normal(jax.random.key(1), (5, 2, 4, 4))
    expected = x
    for layer, p in zip(chain, params):
        expected = layer(p, expected)
    np.testing.assert_array_equal(chain.forward(params, x), expected)
    np.testing.assert_array_equal(chain.apply(params, x), expected)
    assert (
        len(chain) == 5 and isinstance(chain[4], Linear) and chain[1:3] == Chain(chain.layers[1:3])
    )
    assert hash(chain) == hash(small_chain())


def test_plain_callable_layer_in_a_chain():
    def subsample(params, x):  # a user's own layer without params
        return x[:, :, ::2, ::2]

    def scale(params, x):  # a user's own layer with params that the user brings
        return x * params["scale"]

    chain = Chain([Conv2d(1, 2, 3), subsample, Flatten(), scale, Linear(8, 2)])
    params = chain.init(jax.random.key(0))
    assert params[1] == {} and params[3] == {}
    params[3] = {"scale": jnp.full((8,), 0.5)}
    assert chain.shapes((1, 6, 6), params) == [(1, 6, 6), (2, 4, 4), (2, 2, 2), (8,), (8,), (2,)]
    x = jax.random.normal(jax.random.key(1), (3, 1, 6, 6))
    conv, linear = chain[0], chain[4]
    hidden = conv(params[0], x)[:, :, ::2, ::2].reshape(3, 8) * 0.5
    expected = linear(params[4], hidden)
    np.testing.assert_allclose(chain.apply(params, x), expected, rtol=1e-6)
    masks = [None, None, None, {"scale": np.array([True] * 4 + [False] * 4)}, None]
    masked = linear(params[4], hidden.at[:, 4:].set(0))
    np.testing.assert_allclose(chain.apply(params, x, masks=masks), masked, rtol=1e-6)

    def bad(params, x):
        return x @ jnp.ones((3, 3))

    with pytest.raises(
        ValueError, match=r"layer 1 \(bad\): it fails on an input of shape \(3, 4\)"
    ):
        Chain([Flatten(), bad]).apply([{}, {}], x[:, :, :2, :2])
    no_batch = Chain([lambda params, x: x.sum()])
    with pytest.raises(ValueError, match=r"layer 0 \(<lambda>\): a layer must return one array"):
        no_batch.apply([{}], x)


@pytest.fixture
def nothing_traced(monkeypatch):
    """Fails a test if Chain.apply reaches the forward or the layer scan."""

    def fail(*args, **kwargs):
        raise AssertionError("traced before the arguments were validated")

    monkeypatch.setattr(bppsa.scan._core.layer_scan, "apply", fail)
    monkeypatch.setattr(Chain, "forward", fail)
    for layer in (Conv2d, Linear, ReLU, MaxPool2d, Flatten):
        monkeypatch.setattr(layer, "__call__", fail)


def vgg_params(chain):
    # Shapes are all that validation reads: abstract params keep these tests cheap.
    return list(jax.eval_shape(chain.init, jax.random.key(0)))


def bad_mask_shape(params):
    masks = [None] * len(params)
    masks[3] = {"weight": np.ones((64, 64, 3, 3), bool)}
    return masks


def bad_mask_dtype(params):
    masks = [None] * len(params)
    masks[0] = {"weight": np.ones((64, 3, 3, 3), np.float32)}
    return masks


def bad_mask_key(params):
    masks = [{}] * len(params)
    masks[22] = {"weights": np.ones((10, 512), bool)}
    return masks


def replace(params, i, value):
    params = list(params)
    params[i] = value
    return params


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        (
            lambda p: (p, jnp.zeros((2, 3, 64, 64)), None),
            ValueError,
            r"layer 22 \(Linear\): in_features=512 but its input has 2048 features",
        ),
        (
            lambda p: (p, jnp.zeros((2, 3, 16, 16)), None),
            ValueError,
            r"layer 20 \(MaxPool2d\): the kernel height 2 is larger than the input's height 1",
        ),
        (
            lambda p: (p, jnp.zeros((2, 1, 32, 32)), None),
            ValueError,
            r"layer 0 \(Conv2d\): in_channels=3 but its input has 1 channels \(the chain's input",
        ),
        (
            lambda p: (p[:-1], jnp.zeros((2, 3, 32, 32)), None),
            ValueError,
            r"params has 22 entries but the chain has 23 layers",
        ),
        (
            lambda p: ({"layers": p}, jnp.zeros((2, 3, 32, 32)), None),
            TypeError,
            r"params must be a list with one entry per layer, got dict",
        ),
        (
            lambda p: (p, jnp.zeros((2, 3, 32, 32)), bad_mask_shape(p)),
            ValueError,
            r"layer 3 \(Conv2d\): masks\[3\]\['weight'\] has shape \(64, 64, 3, 3\) but its "
            r"params\['weight'\] has shape \(128, 64, 3, 3\)",
        ),
        (
            lambda p: (p, jnp.zeros((2, 3, 32, 32)), bad_mask_dtype(p)),
            TypeError,
            r"layer 0 \(Conv2d\): masks\[0\]\['weight'\] must be a boolean array",
        ),
        (
            lambda p: (p, jnp.zeros((2, 3, 32, 32)), bad_mask_key(p)),
            ValueError,
            r"layer 22 \(Linear\): masks\[22\] masks 'weights', which is not one of its params",
        ),
        (
            lambda p: (p, jnp.zeros((2, 3, 32, 32)), [None] * 3),
            ValueError,
            r"masks has 3 entries but the chain has 23 layers",
        ),
        (
            lambda p: (replace(p, 3, {"weight": p[3]["weight"]}), jnp.zeros((2, 3, 32, 32)), None),
            ValueError,
            r"layer 3 \(Conv2d\): params has keys \['weight'\] but \['bias', 'weight'\]",
        ),
        (
            lambda p: (
                replace(p, 22, {**p[22], "bias": jnp.zeros(9)}),
                jnp.zeros((2, 3, 32, 32)),
                None,
            ),
            ValueError,
            r"layer 22 \(Linear\): params\['bias'\] has shape \(9,\) but \(10,\) was expected",
        ),
        (
            lambda p: (replace(p, 1, None), jnp.zeros((2, 3, 32, 32)), None),
            TypeError,
            r"layer 1 \(ReLU\): params must be a dict",
        ),
        (
            lambda p: (p, jnp.zeros((2, 3, 32, 32), jnp.int32), None),
            TypeError,
            r"x must have a floating dtype",
        ),
        (lambda p: (p, jnp.zeros(()), None), ValueError, r"x must be a batch"),
    ],
)
def test_apply_validates_before_tracing(case, error, message, nothing_traced):
    chain = vgg11()
    params, x, masks = case(vgg_params(chain))
    with pytest.raises(error, match=message):
        chain.apply(params, x, masks=masks)


def test_vgg11_architecture_shapes_and_parameter_count():
    chain = vgg11()
    kinds = [type(layer).__name__ for layer in chain]
    assert kinds.count("Conv2d") == kinds.count("ReLU") == 8 and kinds.count("MaxPool2d") == 5
    assert kinds[-2:] == ["Flatten", "Linear"] and chain[-1] == Linear(512, 10)
    widths = [layer.out_channels for layer in chain if isinstance(layer, Conv2d)]
    assert widths == [64, 128, 256, 256, 512, 512, 512, 512]
    assert all(
        layer.kernel_size == (3, 3) and layer.padding == (1, 1) and layer.stride == (1, 1)
        for layer in chain
        if isinstance(layer, Conv2d)
    )
    shapes = chain.shapes((3, 32, 32))
    assert shapes[-3:] == [(512, 1, 1), (512,), (10,)]
    params = vgg_params(chain)
    # 3*64*9+64 + 64*128*9+128 + 128*256*9+256 + 256*256*9+256 + 256*512*9+512
    # + 3 * (512*512*9+512) + 512*10+10
    assert sum(leaf.size for leaf in jax.tree.leaves(params)) == 9_225_610
    other = vgg11(num_classes=100, in_channels=1)
    assert other[0] == Conv2d(1, 64, 3, padding=1) and other[-1] == Linear(512, 100)


def test_vgg11_forward_on_cifar_sized_batch():
    chain = vgg11()
    # PyTorch's ranges, drawn by NumPy: threefry takes seconds for 9.2M numbers on a CPU.
    rng = np.random.default_rng(0)
    params = []
    for layer in chain:
        shapes = layer.param_shapes()
        bound = 1 / math.sqrt(math.prod(shapes["weight"][1:])) if shapes else 0.0
        params.append(
            {k: rng.uniform(-bound, bound, s).astype(np.float32) for k, s in shapes.items()}
        )
    x = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
    y = jax.jit(chain.apply)(params, x)
    assert y.shape == (2, 10) and np.all(np.isfinite(y)) and np.std(y) > 0
