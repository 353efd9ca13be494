"""The ONNX ops as small jax.numpy/lax functions, one module per family, one registry.

``registry`` holds :class:`~registry.Op`, :class:`~registry.Node` and ``REGISTRY``
(domain -> op type -> Op; ``OPS`` is the ai.onnx table) and imports nothing of
this package; every family module registers its ops there with
``@register("OpType")`` of ``guard``, which puts each function behind the one
guard every op runs behind (the schema's input types checked, host memory errors
named); importing this package imports every family, so whoever reads the
registry sees them all.

- ``elementwise``: arithmetic, unary math (trigonometric and hyperbolic), Shrink,
  comparisons, logic, Where, Clip, Cast, the Bitwise ops, BitShift, BitCast
- ``nn``: activations, Softmax family, MatMul/Gemm/Einsum
- ``conv``: Conv, ConvTranspose
- ``pools``: MaxPool, AveragePool, the global pools, MaxUnpool
- ``normalization``: Batch, Instance, Layer, Group and MeanVariance normalization,
  LRN, Dropout
- ``shape``: Shape, Reshape, Transpose, Concat, Split, Slice, Pad, Trilu, ...,
  Identity, Constant, ConstantOfShape, Range, EyeLike
- ``indexing``: Gather, GatherElements, GatherND, ScatterND, ScatterElements,
  OneHot, ReverseSequence, TensorScatter
- ``reductions``: Reduce*, ArgMax/ArgMin, TopK, CumSum/CumProd, Det
- ``image``: Resize, Upsample, GridSample, AffineGrid
- ``spatial``: Col2Im, DeformConv, RoiAlign (pixels moved by index, sampled at
  traced points)
- ``losses``: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
- ``ml``: the ai.onnx.ml ops scikit-learn exports put around a model
- ``text``: TfIdfVectorizer over integer tokens
- ``trees``: the ai.onnx.ml tree ensembles (TreeEnsembleRegressor,
  TreeEnsembleClassifier, TreeEnsemble), all trees at once in gather steps
- ``control_flow``: If, Loop and Scan (their subgraphs arrive as callables)
- ``recurrent``: RNN, GRU and LSTM, each direction one ``lax.scan``
- ``transformer``: the blocks around attention (RMSNormalization, Swish, SwiGLU,
  RotaryEmbedding)
- ``attention``: Attention, ai.onnx.preview's FlexAttention
- ``linear_attention``: LinearAttention, CausalConvWithState
- ``lp``: LpNormalization and LpPool (windows as the pools', ``windows``)
- ``quantization``: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
  MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv
- ``signal``: DFT, STFT, the Hann, Hamming and Blackman windows,
  MelWeightMatrix
- ``dynamic``: NonZero, Unique, Compress, NonMaxSuppression (an output's
  size set by an input's values, read while tracing)
- ``sequence``: the Sequence* ops, SplitToSequence, ConcatFromSequence and the
  Optional ops (a sequence is a tuple of a length known while tracing, an empty
  optional a marker known while tracing)

and beside them, below every family (a family imports only these, never another
family): ``values`` (the values every op sees: static or traced tensors, the
sequence and optional types), ``arrays`` (the helpers several families share:
dtypes, axes, the size limit, indices checked while tracing or after the run),
``attributes`` (a node's attributes read against its ONNX schema), ``guard``
(``register``), ``windows`` (the window geometry of convolutions and pools),
``convolution`` (how a convolution is computed: Conv, ConvInteger, QLinearConv),
``sampling`` (a tensor sampled at traced points: GridSample, DeformConv, RoiAlign),
``ml_scores`` (the features and score post-transforms of the ai.onnx.ml ops),
``forests`` (a tree ensemble's attributes read into tables)
and ``subgraphs`` (a body's signature checked, the budget of unrolled calls: If,
Loop, Scan, SequenceMap). To add an op: a function in its family's module,
registered there; a new family is a new module here, imported below.
"""

from onnx_optax._src.ops import (  # noqa: F401  (each registers its ops when imported)
    attention,
    control_flow,
    conv,
    dynamic,
    elementwise,
    image,
    indexing,
    linear_attention,
    losses,
    lp,
    ml,
    nn,
    normalization,
    pools,
    quantization,
    recurrent,
    reductions,
    sequence,
    shape,
    signal,
    spatial,
    text,
    transformer,
    trees,
)
from onnx_optax._src.ops.arrays import (
    RunChecks,
    check_size,
    collect_run_checks,
    raise_failed,
    record_run_checks,
)
from onnx_optax._src.ops.attributes import check_omitted_inputs, read_attributes
from onnx_optax._src.ops.ml import ADVICE
from onnx_optax._src.ops.ml_scores import ML_DOMAIN
from onnx_optax._src.ops.registry import (
    MAX_TENSOR_BYTES,
    OPS,
    REGISTRY,
    STANDARD_DOMAINS,
    Node,
    domain_of,
    find_op,
)
from onnx_optax._src.ops.values import NotStaticError, is_static

__all__ = [
    "ADVICE",
    "MAX_TENSOR_BYTES",
    "ML_DOMAIN",
    "OPS",
    "REGISTRY",
    "STANDARD_DOMAINS",
    "Node",
    "NotStaticError",
    "RunChecks",
    "check_omitted_inputs",
    "check_size",
    "collect_run_checks",
    "domain_of",
    "find_op",
    "is_static",
    "raise_failed",
    "read_attributes",
    "record_run_checks",
]
