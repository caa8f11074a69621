# make_fixtures.py — made tests/data/safetensors/ on the device machine (torch 2.11, safetensors 0.8.0, transformers 5.17
# as its package list gives them): hf_single (every dtype, scalar, empty, metadata) by safetensors' save_file,
# rounding (fp32 bit patterns and torch's bf16/fp16 roundings of them), a tiny random Qwen3-MoE saved by
# save_pretrained in 3 shards (m/, config files dropped), and manifest.json: per tensor dtype, shape and FNV-1a 64 of
# its raw bytes and of its fp32 conversion. Writes $OUT/fx.tar. Kept terse: it travelled inside a 2000-character command.
import torch,json,os,glob,numpy as np,transformers as X
from safetensors import safe_open as so
from safetensors.torch import save_file as sf
O=os.environ['OUT'];D='/tmp/fx';os.makedirs(D,exist_ok=True)
g=torch.Generator().manual_seed(0);R=lambda*s:torch.randn(*s,generator=g);L=lambda l,d:torch.tensor(l,dtype=getattr(torch,d))
T={'f32':R(3,4),'bf16':R(5).bfloat16(),'f16':R(2,3).half(),'f64':R(2).double(),'i64':L([-5,1<<40],'int64'),'i32':L([7,-8],'int32'),'i16':L([3,-4],'int16'),'i8':L([-1,2,3],'int8'),'u8':L([1,250],'uint8'),'bool':torch.tensor([True,False,True]),'scalar':torch.tensor(2.5),'empty':torch.zeros(0,4,dtype=torch.bfloat16)}
for d in['float8_e4m3fn','float8_e5m2','float8_e8m0fnu','uint16','uint32','uint64']:
 try:t=torch.tensor([1.,2.,.5]).to(getattr(torch,d));sf({d:t},'/tmp/x');T[d]=t
 except Exception:print('skip',d)
sf(T,D+'/hf_single.safetensors',metadata={'format':'pt','k':'v'})
u=np.random.default_rng(1).integers(0,2**32,8192,dtype=np.uint64).astype(np.uint32)
u[1::4]=u[1::4]&0xc7ffffff|0x38000000;u[2::4]=u[2::4]&0xffff8000|0x8000;u[3::4]=u[3::4]&0x807fffff|0x33000000|u[3::4]&0x07800000
r=torch.from_numpy(u.view(np.float32).copy());r[~torch.isfinite(r)]=1.0
sf({'r':r,'r_bf16':r.bfloat16(),'r_f16':r.half()},D+'/rounding.safetensors')
c=X.Qwen3MoeConfig(vocab_size=64,hidden_size=16,moe_intermediate_size=8,num_hidden_layers=2,num_attention_heads=2,num_key_value_heads=1,head_dim=8,num_experts=4,num_experts_per_tok=2)
torch.manual_seed(0);X.AutoModelForCausalLM.from_config(c,dtype=torch.bfloat16).save_pretrained(D+'/m',max_shard_size='6KB')
def fnv(b):
 h=0xcbf29ce484222325
 for x in b:h=(h^x)*0x100000001b3%2**64
 return'%016x'%h
M={};B=lambda t:fnv(t.reshape(-1).view(torch.uint8).numpy().tobytes())
for f in sorted(glob.glob(D+'/**/*.safetensors',recursive=True)):
 b=open(f,'rb').read();H=json.loads(b[8:8+int.from_bytes(b[:8],'little')])
 with so(f,'pt')as s:
  for k in s.keys():
   t=s.get_tensor(k).contiguous();e={'dtype':H[k]['dtype'],'shape':list(t.shape),'raw':B(t)}
   if t.is_floating_point()and t.element_size()>1:e['f32']=B(t.float())
   M[os.path.relpath(f,D)+':'+k]=e
json.dump(M,open(D+'/manifest.json','w'),indent=1,sort_keys=True)
os.system(f'tar cf {O}/fx.tar -C {D} .')
