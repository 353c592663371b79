pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/out
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/out/gpu.txt
git log --oneline -1 >> /tmp/out/gpu.txt 2>&1
python -m pytest -m gpu tests/aso_se/search/test_graphed_ops.py -q -p no:cacheprovider > /tmp/out/gpu_tests.txt 2>&1
B="python benchmarks/bench_retrain_step.py --rows 1024:fp16:cl --steps 8 --repeats 2 --warmup 3 --conv-backend torch"
$B > /tmp/out/bench_graph.txt 2>&1
( time $B --compile --eager ) > /tmp/out/bench_compile_eager.txt 2>&1
( time $B --compile --compile-mode reduce-overhead --eager ) > /tmp/out/bench_compile_ro.txt 2>&1
