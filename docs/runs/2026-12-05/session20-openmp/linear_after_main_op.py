import sys, threading, time, torch
x=torch.randn(1, 896); w=torch.randn(4864, 896)
def bench(tag):
    with torch.inference_mode():
        for _ in range(200): torch.nn.functional.linear(x, w)
        t0=time.perf_counter()
        for _ in range(3000): torch.nn.functional.linear(x, w)
        print(tag, round((time.perf_counter()-t0)/3000*1e6,1), "us", flush=True)
if sys.argv[1]=="touch":
    torch.nn.functional.linear(x, w)   # one parallel op on the main thread
    time.sleep(1)
t=threading.Thread(target=lambda: (bench("thread"), bench("thread"))); t.start(); t.join()
